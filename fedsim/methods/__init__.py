"""Federated methods, one file each; every module here is imported so it registers."""
from fedsim.discovery import import_submodules
from fedsim.methods.base import Method

import_submodules(__name__)

__all__ = ["Method"]
