"""`--idle-minutes N` of `up` and `run --keep`: the spec option the node-side idle watcher is set up from."""

from __future__ import annotations

from gpucluster.cli.options import Int

IDLE_MINUTES = Int("idle minutes", 1, 7 * 24 * 60)
IDLE_HELP = ("Stop the nodes after N minutes without a gpucluster job (`exec`), whatever this machine does "
             "(aws: they power off; gcp: the GPU nodes are released and the pool scales to zero).")


def with_idle_stop(options: tuple[str, ...], minutes: int | None) -> tuple[str, ...]:
    """The `--option` list with the idle stop added (the cloud's spec rules check and refuse it)."""
    from gpucluster.lifecycle.kept import IDLE_OPTION

    return tuple(options) if minutes is None else (*options, f"{IDLE_OPTION}={int(minutes)}")
