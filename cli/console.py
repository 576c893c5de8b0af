"""The rich Console every command prints with (rich is imported only when a command runs)."""

from __future__ import annotations

import os
import sys


def make_console(stderr: bool = False):
    """A terminal gets its own width; piped or captured output gets $COLUMNS (default 160), so
    tables are not squeezed into 80 columns in logs and CI."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else int(os.environ.get("COLUMNS", "160"))
    return Console(stderr=stderr, highlight=False, width=width, soft_wrap=False)
