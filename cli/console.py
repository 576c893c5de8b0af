"""The rich Console every command prints with (rich is imported only when a command runs)."""

from __future__ import annotations

import os
import sys


def make_console(stderr: bool = False):
    """A terminal gets its own width; piped or captured output gets $COLUMNS (default 160), so
    tables are not squeezed into 80 columns in logs and CI."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else columns()
    return Console(stderr=stderr, highlight=False, width=width, soft_wrap=False)


def columns() -> int:
    """$COLUMNS (default 160) for output that is not a terminal; a value that is not a width is refused."""
    from gpucluster.errors import UsageError

    text = os.environ.get("COLUMNS", "").strip() or "160"
    try:
        width = int(text)
    except ValueError:
        width = 0
    if not 20 <= width <= 10_000:
        raise UsageError(f"COLUMNS {os.environ.get('COLUMNS')!r} is not allowed: a whole number of columns from "
                         "20 to 10000 (or unset it)")
    return width
