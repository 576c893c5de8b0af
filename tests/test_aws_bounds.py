"""A cloud run's time bounds, decided before anything exists and said in the plan (gpucluster.plan.bounds):
how long aws nodes may take to be ready (from the image's boot steps and the node's own bounds;
--ready-timeout overrides), and a node lifetime that holds the job (--max-lifetime vs --max-minutes).

Facts behind the numbers: the ready check waits up to 60 x 10 s for the GPUs (infra/aws/node_ready.sh);
a root volume restored from a snapshot loads lazily, so the first torch import is slow (EBS User
Guide, "Initialize Amazon EBS volumes"); `shutdown` refuses new logins in its last 5 minutes
(shutdown(8)); the dead-man switch powers the node off at first boot + lifetime (user_data.py)."""

from __future__ import annotations

import pytest

from conftest import run_cli
from test_bad_input import assert_clean_refusal, assert_no_run_recorded

from gpucluster.errors import UsageError
from gpucluster.infra.registry import plugin
from gpucluster.lifecycle.prepare import Request, prepare

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def plan(**kw):
    base = dict(cloud="aws", ssh_cidr="203.0.113.7/32", dry_run=True)
    base.update(kw)
    return prepare(Request(**base), plugin("aws"))


def test_the_ready_bound_comes_from_the_image_and_is_shown_and_used():
    p = plan()
    assert p.launcher.ready_timeout == 20 * 60
    (ready,) = [b for b in p.bounds if b.startswith("nodes must be ready")]
    assert ready.startswith("nodes must be ready within 20 min (boot 5 min + the node's wait for its GPUs 10 min + "
                            "first torch import from the lazily restored disk 5 min; --ready-timeout overrides)")
    base = plan(options=("image=base",))
    assert base.launcher.ready_timeout == 35 * 60 and "image=base installs torch 15 min" in base.bounds[0]
    # every g5 size runs the same boot steps: the shape does not change the bound
    assert plan(instance_type="g5.48xlarge").launcher.ready_timeout == 20 * 60
    given = plan(ready_timeout=900)
    assert given.launcher.ready_timeout == 900
    assert given.bounds[0].startswith("nodes must be ready within 15 min (--ready-timeout; the node's own bounds need "
                                      "up to 20 min")


def test_without_max_minutes_the_plan_warns_that_the_lifetime_ends_the_job():
    p = plan()
    assert p.spec.max_lifetime_minutes == 240
    assert any(n.startswith("no --max-minutes: the nodes power off 240 min after their first boot") for n in p.notes)
    assert "nodes power themselves off 240 min after their first boot (--max-lifetime)" in p.bounds


def test_the_default_lifetime_is_raised_to_hold_the_job_and_its_margins():
    p = plan(max_minutes=300)
    # ready 20 + job 300 + staging/setup 10 + outputs 10 + nologin 5
    assert p.spec.max_lifetime_minutes == 345
    assert any(b.startswith("nodes power themselves off 345 min after their first boot: raised from the default 240 "
                            "to fit --max-minutes 300") for b in p.bounds)
    assert not any("no --max-minutes" in n for n in p.notes)
    # the dead-man switch the program writes carries the raised lifetime
    from gpucluster.infra.aws.dryrun import dry_run

    assert "60 * 345" in _deadman(p.spec)
    assert dry_run(p.spec)["instances"]["count"] == 2
    # a job that fits the default leaves it alone
    assert plan(max_minutes=60).spec.max_lifetime_minutes == 240


def _deadman(spec) -> str:
    import yaml

    from gpucluster.infra.aws import user_data as boot
    from gpucluster.infra.aws.mock_runtime import build, unwrap

    import base64

    doc = yaml.safe_load(base64.b64decode(unwrap(build(spec).recorder.node_template().inputs["userData"])).decode())
    return next(f["content"] for f in doc["write_files"] if f["path"] == boot.DEADMAN_SCRIPT_PATH)


def test_a_given_lifetime_too_short_for_the_job_is_refused():
    with pytest.raises(UsageError) as err:
        plan(max_minutes=300, max_lifetime=200)
    assert err.value.message == ("--max-lifetime 200 is not allowed with --max-minutes 300: the nodes would power off "
                                 "before the job, its outputs and teardown are done; allowed: 345 or more (ready 20 + "
                                 "the job 300 + staging and --setup 10 + copying outputs back 10 + shutdown's nologin "
                                 "window 5 minutes)")
    assert plan(max_minutes=300, max_lifetime=345).spec.max_lifetime_minutes == 345
    with pytest.raises(UsageError, match=r"--max-minutes 10080 is not allowed here.*allowed: --max-minutes 10035"):
        plan(max_minutes=7 * 24 * 60)


def test_the_cli_refuses_it_in_one_line_before_anything_is_recorded(home):
    r = run_cli("run", "--cloud", "aws", "--ssh-cidr", "203.0.113.7/32", "--max-minutes", "300", "--max-lifetime",
                "200", "--yes")
    assert_clean_refusal(r, "--max-lifetime 200 is not allowed with --max-minutes 300", "allowed: 345 or more")
    assert_no_run_recorded(home)


def test_clouds_without_a_dead_man_switch_have_no_lifetime_bound():
    p = prepare(Request(cloud="local", nodes=1, max_minutes=5), plugin("local"))
    assert p.bounds == [] and not any("max-minutes" in n for n in p.notes)


# -- regions: the ones it can price and that offer the type ------------------------------------------
def test_an_unpriced_region_is_refused_with_the_refresh_that_prices_it(home):
    """The shipped catalog prices us-east-1, us-west-2 and eu-west-1 (FACTS.md); g5 is offered in 19
    regions. A region offering the type but not priced is refused, naming the refresh; an opt-in region
    (AWS Account Management guide, "Specify which AWS Regions your account can use") says so too; a
    region priced by a refresh is accepted."""
    import json

    from gpucluster.catalog.prices import user_catalog_path

    with pytest.raises(UsageError) as err:
        plan(region="us-east-2")
    assert err.value.message == (
        "aws region 'us-east-2' has no prices in the catalog; allowed: eu-west-1, us-east-1, us-west-2, or us-east-2 "
        "once priced: `gpucluster prices refresh --cloud aws --region us-east-2` (needs aws credentials)")
    with pytest.raises(UsageError, match=r"il-central-1 is an opt-in region: enable it first with `aws account "
                                         r"enable-region --region-name il-central-1`"):
        plan(region="il-central-1")
    with pytest.raises(UsageError, match=r"no spot price for g5.xlarge in eu-west-1 .* `gpucluster prices refresh "
                                         r"--cloud aws --region eu-west-1`"):
        plan(region="eu-west-1", spot=True)
    # what `prices refresh --cloud aws --region us-east-2` writes (its rows' shape: test_prices.py)
    path = user_catalog_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"format": 1, "currency": "USD", "rows": [
        {"cloud": "aws", "region": "us-east-2", "kind": "instance", "item": "g5.xlarge", "market": "on-demand",
         "unit": "hour", "price": "1.006", "gpus": 1, "gpu": "A10G", "source": "AWS Price List API", "date": "2026-12-01"},
        {"cloud": "aws", "region": "us-east-2", "kind": "disk", "item": "gp3", "market": "on-demand",
         "unit": "gb-month", "price": "0.08", "gpus": 0, "source": "AWS Price List API", "date": "2026-12-01"}]}))
    p = plan(region="us-east-2")
    assert p.spec.region == "us-east-2" and p.estimate is not None
    # a region that does not offer the type stays refused by the spec check, priced or not
    with pytest.raises(UsageError, match="not offered in region 'us-west-1'"):
        plan(region="us-west-1")


@pytest.mark.integration  # a real process or server: not in `make test-fast`
def test_a_price_borrowed_from_another_region_is_said_in_the_plan(home):
    """FACTS.md gives EBS gp3 for us-east-1 only: a us-west-2 or eu-west-1 plan prices the root volumes at
    us-east-1's gp3 price, and `run`/`up` say so under the estimate (before, only `cost estimate` did)."""
    for verb in (("run",), ("up",)):
        r = run_cli(*verb, "--cloud", "aws", "--region", "eu-west-1", "--ssh-cidr", "203.0.113.7/32", "--dry-run",
                    *(["--", "python", "-c", "pass"] if verb == ("run",) else []))
        assert r.returncode == 0, r.stderr
        text = r.stdout + r.stderr
        assert "estimate: no gp3 price for eu-west-1 in the catalog: used us-east-1's (0.08/GB-month)" in text, text
    r = run_cli("run", "--cloud", "aws", "--region", "us-east-1", "--ssh-cidr", "203.0.113.7/32", "--dry-run",
                "--", "python", "-c", "pass")
    assert r.returncode == 0 and "estimate: no gp3 price" not in r.stdout + r.stderr
