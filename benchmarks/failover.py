"""Placement failover (issue 43 item 3): from a capacity error to the next candidate's create request.

The real ranking of 4 × L4 nodes on aws and gcp (gpucluster.plan.placement: gcp us-central1-a, -b, -c,
europe-west4-a, -b, -c, aws us-east-1, ...) run through gpucluster.lifecycle.failover on the stand-ins of
tests/test_failover.py: the real Automation API driver on the fake Pulumi CLI, the real lifecycle,
ledger and teardown check; tag scan and launcher stubbed. Every GKE candidate fails with
ZONE_RESOURCE_POOL_EXHAUSTED after its cluster was created; aws us-east-1 succeeds.

Figure per failover: from the moment the failed `pulumi up` returned (the capacity error) to the
next candidate's `pulumi up` starting (its create request), which covers the failed attempt's
destroy, its teardown check, the ledger records and the next run's ledger row.

Fake delays (STEP_S, default "0,2"): every resource step of the fake CLI, create and delete alike,
takes STEP_S seconds (0: gpucluster's own overhead; 2: the failed attempt's one created resource, the
GKE cluster, is deleted in 2 s; real GKE takes minutes to delete a cluster, and this figure then
includes them: docs/placement.md). Not a test.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from _util import ROOT

sys.path.insert(0, str(ROOT / "tests"))


def _case(step_s: float) -> list[float]:
    from pulumi_fake import FakePulumiCommand
    from test_failover import EC2_CAPACITY, GKE_RESOURCES, GKE_STOCKOUT, _placed, _run  # noqa: F401

    home = Path(tempfile.mkdtemp(prefix="gpucluster-bench-failover-"))
    os.environ["GPUCLUSTER_HOME"] = str(home)
    placement = _placed()
    fakes = {}
    marks: list[tuple[str, float]] = []  # ("start" | "failed", when) of every `up`, in order
    for c in placement.ranked:
        fail = dict(fail_up_after=1, fail_text=GKE_STOCKOUT.format(zone=c.zones[0] if c.zones else "")) \
            if c.cloud == "gcp" else {}
        fake = FakePulumiCommand(resources=GKE_RESOURCES if c.cloud == "gcp" else None, step_delay_s=step_s, **fail)
        fakes[(c.cloud, c.region)] = fake

        def run(args, *a, _real=fake.run, **kw):
            is_up = [w for w in args if not w.startswith("-")][:1] == ["up"]
            if is_up:
                marks.append(("start", time.monotonic()))
            try:
                result = _real(args, *a, **kw)
            except BaseException:
                if is_up:
                    marks.append(("failed", time.monotonic()))
                raise
            if is_up and getattr(result, "code", 0):
                marks.append(("failed", time.monotonic()))
            return result

        fake.run = run
    chain, ledger, messages, requested = _run(placement, fakes, home)
    assert chain.final.status == "succeeded", chain.final.failure
    gaps = [b[1] - a[1] for a, b in zip(marks, marks[1:]) if a[0] == "failed" and b[0] == "start"]
    return gaps


def main() -> None:
    for step in (float(s) for s in os.environ.get("STEP_S", "0,2").split(",")):
        gaps = _case(step)
        print(f"failover, fake step {step:g} s: capacity error -> next create request "
              f"{', '.join(f'{g:.2f}' for g in gaps)} s (median {statistics.median(gaps):.2f}, max {max(gaps):.2f}; "
              f"goal <= 60 s)")


if __name__ == "__main__":
    main()
