"""The parse-run-report path of every diagnostic's entry point: a :class:`fedsim.errors.UserError` is one line on
stderr and exit code 2."""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Optional, Sequence

from fedsim.errors import UserError


def run_command(
    parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int], argv: Optional[Sequence[str]]
) -> int:
    """Parse ``argv`` with ``parser``, then ``run`` the arguments; a UserError is one line on stderr, exit code 2."""
    args = parser.parse_args(argv)
    try:
        return run(args)
    except UserError as exc:
        print(f"fedsim: error: {exc}", file=sys.stderr)
        return 2
