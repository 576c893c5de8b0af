"""Issue 45 item 10: inputs the fourth campaign found taken (a dry run printed a plan, a report came
out empty, a sweep of the account ran into 27 unchecked lines) that are now refused before anything
is created: one line naming the value and what is allowed, exit 2, no traceback, no run recorded.

Each was checked to pass (exit 0, or gc's exit 3) on the code before this change."""

from __future__ import annotations

import pytest

from conftest import run_cli
from test_bad_input import assert_clean_refusal, assert_no_run_recorded

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md): CLI subprocesses

SIXTY_TAGS = tuple(a for i in range(60) for a in ("--tag", f"k{i}=v"))

CASES = {
    # EC2 zone letters run a to f (no region has more than six zones)
    "zone-letter": (("run", "--cloud", "aws", "--zone", "us-east-1z", "--dry-run", "--", "python", "x.py"),
                    {}, ("'us-east-1z'", "us-east-1f")),
    # EC2 tag values and GCP label values refuse control characters
    "tag-newline": (("run", "--cloud", "aws", "--tag", "team=a\nb", "--dry-run", "--", "python", "x.py"),
                    {}, ("tag team value", "'a\\nb'", "newline")),
    # EC2: 50 tags per resource, some of them gpucluster's own
    "sixty-tags": (("run", "--cloud", "aws", *SIXTY_TAGS, "--dry-run", "--", "python", "x.py"),
                   {}, ("number of tags 60", "at most 40")),
    "empty-project": (("run", "--cloud", "gcp", "--project", "", "--dry-run", "--", "python", "x.py"),
                      {}, ("--project ''", "give a value")),
    "free-tier-aws": (("cost", "estimate", "--cloud", "aws", "--free-tier"), {}, ("--free-tier", "--cloud aws")),
    "report-project-local": (("cost", "report", "--cloud", "local", "--project", "my-project"),
                             {}, ("--project my-project", "--cloud local")),
    "gc-region-from-env": (("gc", "--cloud", "aws", "--yes"), {"AWS_REGION": "mars-1"},
                           ("'mars-1'", "AWS_REGION")),
    # the option gets the checks the flag gets: --idle-minutes without --keep is refused
    "idle-option-unkept": (("run", "--cloud", "aws", "--option", "idleMinutes=5", "--dry-run", "--", "python", "x.py"),
                           {}, ("idleMinutes=5", "--keep")),
    # a GKE system pool machine that does not exist (Compute Engine's N1 types: 1, 2, 4, ... 96 vCPUs)
    "system-machine-type": (("run", "--cloud", "gcp", "--project", "my-proj-123", "--option",
                             "systemMachineType=n1-standard-0", "--dry-run", "--", "python", "x.py"),
                            {}, ("systemMachineType 'n1-standard-0'", "n1-standard-2")),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_before_anything_is_created(home, tmp_path, case):
    args, env, needles = CASES[case]
    (tmp_path / "x.py").write_text("print('hello')\n")
    r = run_cli(*args, env={"AWS_REGION": "", **env}, cwd=tmp_path, timeout=120)
    assert_clean_refusal(r, *needles)
    assert_no_run_recorded(home)
