"""Errors and exit codes.

Nothing below the CLI prints or exits: code raises a `GpuclusterError` subclass and the CLI turns
it into a one-line message and the exit code carried by the error.
"""

from __future__ import annotations

import difflib
from enum import IntEnum
from types import ModuleType
from typing import Iterable


class ExitCode(IntEnum):
    OK = 0
    FAILURE = 1  # runtime failure: the run failed, a resource could not be created, ...
    USAGE = 2  # bad input: nothing was created
    LEFTOVERS = 3  # the run ended but something it created may still exist (and bill)
    COST_CAP = 4  # --max-cost: the run was stopped at its cost cap (outputs home, torn down)
    INTERRUPTED = 130  # Ctrl-C / SIGTERM; teardown still ran


class GpuclusterError(Exception):
    """Base of every error the CLI reports as a message rather than a traceback."""

    exit_code: ExitCode = ExitCode.FAILURE

    def __init__(self, message: str, *, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class CostCapReached(GpuclusterError):
    """A kept cluster's --max-cost is reached: no further job is started on it."""

    exit_code = ExitCode.COST_CAP


class UsageError(GpuclusterError):
    """Bad input (flags, spec, config). Raised before anything is created."""

    exit_code = ExitCode.USAGE


class SpecError(UsageError):
    """A cluster spec that cannot be created as asked."""


class ConfigError(UsageError):
    """A file or environment setting that cannot be used (home dir, stack config, catalog)."""


class ProvisionError(GpuclusterError):
    """The cloud refused or failed to create the cluster. `cause` is "capacity" (no capacity for the
    request there) or "quota" (a quota too low there) when the backend recognised its cloud's error as
    one of those, else None: placement fails over on both and recovery on capacity
    (gpucluster.lifecycle.failover, recovery), so it travels with the error, not as text to match."""

    cause: str | None = None

    def __init__(self, message: str, *, hint: str | None = None, cause: str | None = None):
        super().__init__(message, hint=hint)
        if cause is not None:
            self.cause = cause


class ClusterBusy(ProvisionError):
    """Another live process owns the cluster or holds its Pulumi lock: nothing was changed, and
    nothing may be deleted (not even by tag) from under it. Exit 2: nothing was started."""

    exit_code = ExitCode.USAGE


class LaunchError(GpuclusterError):
    """The training job could not be started or failed."""


class TeardownIncomplete(GpuclusterError):
    """Teardown ran but something it created may still exist."""

    exit_code = ExitCode.LEFTOVERS


class MissingDependency(GpuclusterError):
    """An optional dependency (torch, pulumi, boto3, ...) is needed for this command."""


def did_you_mean(value: str, choices: Iterable[str]) -> str:
    """' (did you mean "x"?)' when a close choice exists, else ''."""
    close = difflib.get_close_matches(str(value), list(choices), n=1, cutoff=0.6)
    return f' (did you mean "{close[0]}"?)' if close else ""


def not_allowed(what: str, value: object, allowed: Iterable[str] | str) -> str:
    """One line naming the bad value and what is allowed, with a suggestion when one is close."""
    if isinstance(allowed, str):
        return f"{what} {value!r} is not allowed: {allowed}"
    allowed = list(allowed)
    hint = did_you_mean(str(value), allowed)
    shown = ", ".join(allowed[:12]) + (", ..." if len(allowed) > 12 else "")
    return f"{what} {value!r} is not allowed{hint}; allowed: {shown}"


def require(module: str, extra: str) -> ModuleType:
    """Import an optional dependency or raise a clear MissingDependency."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(
            f"this needs the Python package {module.split('.')[0]!r}, which is not installed "
            f"({exc}); install it with: pip install 'gpucluster[{extra}]'"
        ) from None
