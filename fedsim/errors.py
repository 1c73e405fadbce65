"""Errors that end a run with one line: the CLI prints their message and exits with code 2."""

from __future__ import annotations

from typing import Optional


class UserError(Exception):
    """Bad input (config, data file, flag, address): the message names the problem and the fix."""


class MissingDependency(UserError):
    """An optional package a feature needs is not installed (e.g. torchvision for the detection methods)."""


class NumericalError(UserError, ValueError):
    """A quantity the run computed (a loss, alpha, a weight) is no longer finite (a ValueError to library callers).

    Raised where the value is found with ``quantity`` (what it is), ``detail`` (its first values) and ``hint`` (the
    settings to change); the runtime adds the method, round and client (:meth:`located`) and the last checkpoint
    as the error passes the client host, the server and the simulator. Every field lives in ``args``, so the error
    pickles across processes (Ray actors) unchanged.
    """

    FIELDS = ("quantity", "detail", "hint", "method", "round", "client", "checkpoint")
    """The names of ``args``, in order: each is also an attribute (``error.round``)."""

    def __init__(
        self,
        quantity: str,
        detail: str = "",
        hint: str = "",
        method: Optional[str] = None,
        round: Optional[int] = None,
        client: Optional[object] = None,
        checkpoint: Optional[str] = None,
    ):
        super().__init__(quantity, detail, hint, method, round, client, checkpoint)

    def __getattr__(self, name: str):
        if name in NumericalError.FIELDS:
            return self.args[NumericalError.FIELDS.index(name)]
        raise AttributeError(name)

    def located(self, **where) -> "NumericalError":
        """This error with the fields in ``where`` (method, round, client, checkpoint) filled in where unset."""
        values = dict(zip(self.FIELDS, self.args))
        values.update({k: v for k, v in where.items() if values.get(k) is None and v is not None})
        self.args = tuple(values[k] for k in self.FIELDS)
        return self

    def __str__(self) -> str:
        where = [str(self.method)] if self.method else []
        if self.round is not None:
            where.append(f"round {self.round}")
        if self.client is not None:
            where.append("the server" if self.client == "server" else f"client {self.client}")
        text = f"{', '.join(where)}: " if where else ""
        text += f"{self.quantity} is no longer finite" + (f" ({self.detail})" if self.detail else "")
        text += f": {self.hint}" if self.hint else ""
        return text + (f" ({self.checkpoint})" if self.checkpoint else "")


def first_values(value, count: int = 5) -> str:
    """The first ``count`` entries of ``value`` (an array or tensor), as a short text for a NumericalError."""
    import numpy as np

    flat = np.asarray(getattr(value, "detach", lambda: value)(), dtype=np.float64).ravel()
    shown = ", ".join(f"{v:.4g}" for v in flat[:count])
    return shown + (", ..." if flat.size > count else "")


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type's name when the message is empty (for one-line
    errors)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def typed_first_line(exc: BaseException) -> str:
    """:func:`first_line` after the exception's type: ``ValueError: bad value``."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def unwrapped(exc: BaseException) -> BaseException:
    """The error a remote call raised, out of the wrappers a backend put around it: Ray's ``RayTaskError`` keeps it
    as ``.cause``, nested once per actor it passed through (a client actor, then the server actor)."""
    for _ in range(16):
        cause = getattr(exc, "cause", None)
        if not isinstance(cause, BaseException) or cause is exc:
            return exc
        exc = cause
    return exc
