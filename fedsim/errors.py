"""Errors a user can fix: the CLI prints their message on one line and exits with code 2."""


class UserError(Exception):
    """Bad input (config, data file, flag, address): the message names the problem and the fix."""


class MissingDependency(UserError):
    """An optional package a feature needs is not installed (e.g. torchvision for the detection methods)."""
