"""A run's time bounds on machines the tool creates, decided before anything exists and said in the
plan: how long the nodes may take to be ready, and how long they live.

- Ready: the backend says how long its nodes may need, and why (`SpecRules.ready_within`: aws
  derives it from the image's boot steps and the node's own bounds); `--ready-timeout` overrides.
- Lifetime: nodes that power themselves off (backends with the `max_lifetime` flag: aws's dead-man
  switch) must outlive the job. Their lifetime must hold the ready bound, the job's
  `--max-minutes`, and margins for staging and setup, copying outputs back and `shutdown`'s
  last-5-minute nologin window (shutdown(8) writes /run/nologin 5 minutes before a scheduled
  power-off). A `--max-lifetime` given and too short is refused (exit 2); the default is raised to
  fit and the plan says so; a job without `--max-minutes` is warned about.

Nothing here knows a cloud: the backend's traits and spec rules are passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gpucluster.errors import UsageError

if TYPE_CHECKING:
    from gpucluster.infra.contract import Plugin
    from gpucluster.spec import ClusterSpec

DEFAULT_LIFETIME_MINUTES = 240
# what a node's lifetime holds besides the ready bound and the job, in minutes
LIFETIME_MARGINS = (("staging and --setup", 10), ("copying outputs back", 10),
                    ("shutdown's nologin window", 5))


@dataclass
class Bounds:
    ready_timeout: int | None = None  # seconds the launcher waits for every node (None: its own default)
    lifetime: int | None = None  # the nodes' max lifetime in minutes (None: not a self-powering-off backend)
    lines: list[str] = field(default_factory=list)  # said under the plan
    warnings: list[str] = field(default_factory=list)  # said as warnings before the plan


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds % 60 == 0 else f"{seconds:g} s"


def decide(backend: Plugin, spec: ClusterSpec, *, ready_timeout: int | None, max_lifetime: int | None,
           max_minutes: float | None, job: bool, longest: int = 7 * 24 * 60) -> Bounds:
    """The bounds of a run (`job`) or a cluster alone of `spec` on `backend`; UsageError (exit 2)
    for a `max_lifetime` that cannot hold the job."""
    out = Bounds()
    derived = backend.spec.ready_within(spec)
    if ready_timeout is not None:
        out.ready_timeout = int(ready_timeout)
        if derived is not None:
            out.lines.append(f"nodes must be ready within {_minutes(out.ready_timeout)} (--ready-timeout; the "
                             f"node's own bounds need up to {_minutes(derived[0])}: {derived[1]})")
    elif derived is not None:
        out.ready_timeout = int(derived[0])
        out.lines.append(f"nodes must be ready within {_minutes(out.ready_timeout)} ({derived[1]}; "
                         "--ready-timeout overrides)")
    if "max_lifetime" not in backend.traits.flags:
        return out
    given = max_lifetime
    lifetime = int(given if given is not None else DEFAULT_LIFETIME_MINUTES)
    out.lifetime = lifetime
    if not job:
        out.lines.append(f"nodes power themselves off {lifetime} min after their first boot (--max-lifetime)")
        return out
    if max_minutes is None:
        out.lines.append(f"nodes power themselves off {lifetime} min after their first boot (--max-lifetime)")
        out.warnings.append(f"no --max-minutes: the nodes power off {lifetime} min after their first boot whatever "
                            "the job is doing, and what it has not copied back by then is lost; give the job a "
                            "--max-minutes (the lifetime is then raised to fit it) or a longer --max-lifetime")
        return out
    parts = [("ready", math.ceil((out.ready_timeout or 0) / 60)), ("the job", math.ceil(max_minutes)),
             *LIFETIME_MARGINS]
    needed = sum(m for _, m in parts)
    how = " + ".join(f"{what} {m}" for what, m in parts)
    if needed > longest:
        raise UsageError(f"--max-minutes {max_minutes:g} is not allowed here: with the margins the nodes would need a "
                         f"lifetime of {needed} min ({how}), more than the {longest} allowed; allowed: --max-minutes "
                         f"{longest - (needed - math.ceil(max_minutes))} or less")
    if lifetime >= needed:
        out.lines.append(f"nodes power themselves off {lifetime} min after their first boot (--max-lifetime; "
                         f"the run needs {needed}: {how})")
    elif given is not None:
        raise UsageError(f"--max-lifetime {given} is not allowed with --max-minutes {max_minutes:g}: the nodes would "
                         f"power off before the job, its outputs and teardown are done; allowed: {needed} or more "
                         f"({how} minutes)")
    else:
        out.lifetime = needed
        out.lines.append(f"nodes power themselves off {needed} min after their first boot: raised from the default "
                         f"{lifetime} to fit --max-minutes {max_minutes:g} ({how})")
    return out
