"""Placement, issue 43 items 1, 2 and 5 (docs/placement.md): every machine of a place that carries the
GPU asked is a candidate; a run's bucket (`--data`, `--output`) constrains where it may run, and a
candidate that would read or write it across a region or cloud border is dropped naming the egress
price, or (`--allow-egress`) kept with that price in its total; what a placement's preflights ask
alike is asked once.

Stand-ins, at their worst:
- moto's S3 (5.2.5) for the bucket lookup: GetBucketLocation answers a null LocationConstraint for a
  us-east-1 bucket, as S3 does (https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetBucketLocation.html),
  and ListObjectsV2 pages of 1,000 keys (https://docs.aws.amazon.com/AmazonS3/latest/API/API_ListObjectsV2.html).
- `aws_strict.StrictSession` over moto for the preflight (its module docstring names what it adds to
  moto and why); its `calls` is every API request made, which is what the sharing test counts.
"""

from __future__ import annotations

import json
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))

from test_placement import NO_CREDENTIALS, cli  # noqa: E402,F401 (the fixture)


def _json(res) -> dict:
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_every_machine_of_a_place_with_the_gpu_is_a_candidate_ranked_by_price(cli):
    d = _json(cli("cost", "estimate", "--cloud", "aws", "--region", "auto", "--gpu", "L4", "--json"))
    types = [c["instance_type"] for c in d["candidates"] if c["region"] == "us-east-1"]
    # the catalog prices three 1 × L4 machines in us-east-1 (prices.json): each a candidate, cheapest first
    assert types[:3] == ["g6.xlarge", "g6.4xlarge", "g6.8xlarge"]
    assert [Decimal(c["total"]) for c in d["candidates"]] == sorted(Decimal(c["total"]) for c in d["candidates"])
    assert len(set(types)) == len(types)  # the --gpu pick is not listed twice


def test_a_capacity_error_on_the_cheapest_machine_falls_over_to_the_next_machine_of_the_place(home):
    """The ranking failover walks: after g6.xlarge in us-east-1 comes g6.4xlarge in us-east-1, before
    another region (--region us-east-1 given; across regions the ranking is by price alone)."""
    from gpucluster.infra.registry import plugin
    from gpucluster.plan.placement import place
    from gpucluster.lifecycle.prepare import Request, prepare

    req = Request(cloud="aws,gcp", region="us-east-1", gpu="L4", nodes=1, dry_run=True, job=False)
    placed = place(req, {"aws": plugin("aws")}, prepare=prepare, preflight=None)
    first, second = placed.tried[:2]
    assert (first.region, first.instance_type) == ("us-east-1", "g6.xlarge")
    assert (second.region, second.instance_type) == ("us-east-1", "g6.4xlarge")
    assert second.plan.spec.instance_type == "g6.4xlarge"  # the plan failover would create is that machine's


def test_the_plan_table_shows_the_top_and_says_how_many_more(cli):
    res = cli("cost", "estimate", "--cloud", "aws,gcp", "--gpu", "L4")
    assert res.exit_code == 0, res.output
    d = _json(cli("cost", "estimate", "--cloud", "aws,gcp", "--gpu", "L4", "--json"))
    assert len(d["candidates"]) > 10
    assert f"{len(d['candidates']) - 10} more ranked" in res.output
    assert "egress" in res.output  # the column


def test_a_dry_run_drops_the_other_clouds_candidates_naming_the_egress_price(cli):
    d = _json(cli("run", "--cloud", "aws,gcp", "--gpu", "L4", "--nodes", "1", "--data", "s3://train-bucket/set",
                  "--dry-run", "--json"))
    assert {c["cloud"] for c in d["candidates"]} == {"aws"}
    (gcp,) = [c for c in d["dropped"] if c["cloud"] == "gcp"]
    assert "data in s3://train-bucket/set is on aws; reading it from gcp costs $0.09/GB internet egress" in gcp["dropped"]
    # no credentials in a dry run: the bucket's region and size are not checked, said per candidate
    assert all(c["egress"] == {"gb": None, "cost": None, "why": "not checked", "crossed": [
        "s3://train-bucket/set: region not checked"]} for c in d["candidates"])


def test_outputs_to_the_other_clouds_bucket_are_said_the_same_way(cli):
    d = _json(cli("run", "--cloud", "aws,gcp", "--gpu", "L4", "--nodes", "4", "--output", "gs://results/run",
                  "--project", "my-project-1", "--dry-run", "--json"))
    assert {c["cloud"] for c in d["candidates"]} == {"gcp"}
    (aws,) = [c for c in d["dropped"] if c["cloud"] == "aws"]
    assert "outputs go to gs://results/run on gcp; writing them from aws costs $0.09/GB internet egress" in aws["dropped"]


@pytest.fixture
def s3(monkeypatch):
    moto = pytest.importorskip("moto")
    for name in NO_CREDENTIALS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with moto.mock_aws():
        import boto3

        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="train-bucket")
        for i in range(3):
            client.put_object(Bucket="train-bucket", Key=f"set/part-{i}", Body=b"x" * 2_000_000)
        client.put_object(Bucket="train-bucket", Key="other/big", Body=b"y" * 5_000_000)  # not under the prefix
        yield client


def _real_run_placement(allow_egress: bool):
    """`--cloud aws --region auto --data s3://train-bucket/set` as a real run places it: the bucket looked
    up with aws's own lookup (moto), the cloud's preflight passed (its checks are the next test's)."""
    from gpucluster.cli.place import bucket_facts
    from gpucluster.infra.registry import plugin, readers
    from gpucluster.plan.placement import place
    from gpucluster.lifecycle.prepare import Request, prepare

    req = Request(cloud="aws", region="auto", gpu="L4", nodes=1, dry_run=True, job=True, max_minutes=60,
                  data=("s3://train-bucket/set",), readers=readers())
    return place(req, {"aws": plugin("aws")}, prepare=prepare, preflight=lambda plan: None,
                 allow_egress=allow_egress, facts=bucket_facts)


def test_another_region_of_the_buckets_cloud_is_dropped_without_allow_egress(s3, home):
    placed = _real_run_placement(allow_egress=False)
    assert {c.region for c in placed.ranked} == {"us-east-1"}
    west = [c for c in placed.dropped if c.region == "us-west-2"]
    assert west and all(c.dropped == "data in s3://train-bucket/set is on aws us-east-1; reading it from aws us-west-2 "
                        "costs $0.02/GB inter-region egress: --allow-egress" for c in west)
    assert all(c.egress is None for c in placed.ranked)  # read where it is: nothing crossed


def test_allow_egress_keeps_it_with_the_listed_size_priced_into_its_total(s3, home):
    placed = _real_run_placement(allow_egress=True)
    west = [c for c in placed.ranked if c.region == "us-west-2"]
    assert west
    for c in west:
        assert c.egress is not None and c.egress.gb == Decimal("0.006")  # 3 × 2 MB under set/, not other/
        assert c.egress.cost == Decimal("0.006") * Decimal("0.02")
        assert c.total == c.plan.estimate.total + c.egress.cost
        assert c.to_dict()["egress"]["gb"] == "0.006"


def test_a_bucket_that_cannot_be_looked_up_is_said_in_the_table(s3, home, monkeypatch):
    from gpucluster.infra.aws import s3 as aws_s3

    monkeypatch.setattr(aws_s3, "split", lambda url: ("no-such-bucket", ""))
    placed = _real_run_placement(allow_egress=True)
    west = [c for c in placed.ranked if c.region == "us-west-2"]
    assert west and all(c.egress is not None and c.egress.cost is None and "NoSuchBucket" in " ".join(c.egress.lines)
                        for c in west)
    from gpucluster.plan.placement import table_rows

    rows = [row for row in table_rows(placed, top=50) if row[2] == "us-west-2"]
    assert rows and all(row[7] == "region unknown" and "NoSuchBucket" in row[8] for row in rows)


def test_the_preflights_of_one_place_ask_what_they_share_once(home, monkeypatch):
    """Three 1 × L4 machines in us-east-1, each preflighted against the same account: who the caller is,
    the region's G/VT quota, the vCPUs running against it and the image are asked once, not three times."""
    moto = pytest.importorskip("moto")
    from aws_strict import StrictSession, quota_rule
    from test_aws_preflight import dlami_rule

    from gpucluster.infra.aws.preflight import GVT_ON_DEMAND, GVT_SPOT, preflight
    from gpucluster.infra.registry import plugin
    from gpucluster.plan.placement import candidates, place
    from gpucluster.lifecycle.prepare import Request, prepare

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    req = Request(cloud="aws", region="us-east-1", gpu="L4", nodes=1, dry_run=True, job=False)
    measured = {}
    with moto.mock_aws():
        for how in ("each asks", "shared"):
            session = StrictSession("us-east-1")
            session.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 64.0, GVT_SPOT: 64.0}))
            session.on("ec2", "DescribeImages", dlami_rule())
            seen: list[str] = []

            def check(plan):
                seen.append(plan.spec.instance_type)
                preflight(plan.spec, session=session)

            t0 = time.monotonic()
            if how == "each asks":  # the candidates alone, outside a placement: every preflight asks all
                found = [c for c in candidates(req, {"aws": plugin("aws")}, prepare=prepare, preflight=check)]
            else:
                found = place(req, {"aws": plugin("aws")}, prepare=prepare, preflight=check).ranked
            measured[how] = (len(session.calls), time.monotonic() - t0, [(s, o) for s, o, _ in session.calls])
            assert len(seen) == 3 and all(c.dropped is None for c in found), [c.dropped for c in found]
    each, shared = measured["each asks"], measured["shared"]
    print(f"preflight of 3 candidates in us-east-1: {each[0]} API calls in {each[1]:.2f} s each asking; "
          f"{shared[0]} in {shared[1]:.2f} s shared")
    for op in (("sts", "GetCallerIdentity"), ("service-quotas", "GetServiceQuota"), ("ec2", "DescribeImages")):
        assert each[2].count(op) == 3 and shared[2].count(op) == 1, op
    assert shared[2].count(("ec2", "RunInstances")) == 3  # each machine's own launch is still dry-run
    assert shared[0] < each[0]


def test_the_zones_of_one_gcp_region_ask_their_project_once(home):
    """GKE candidates are zonal: every zone of us-central1 is one, and each preflight asks the same
    project's APIs, billing, regional quotas, network and node account (tests/google_fake.py, the
    FakeProject stand-in of those APIs). Within a placement they are asked once for the region."""
    from google_fake import FakeProject

    from gpucluster.infra.gcp.preflight import preflight
    from gpucluster.infra.registry import plugin
    from gpucluster.plan.placement import candidates, place
    from gpucluster.lifecycle.prepare import Request, prepare

    req = Request(cloud="gcp", region="us-central1", gpu="V100", nodes=1, dry_run=True, job=False,
                  project="my-proj-42")
    measured = {}
    for how in ("each asks", "shared"):
        fake = FakeProject().ready()
        zones: list[str] = []

        def check(plan):
            zones.append(plan.spec.zone)
            preflight(plan.spec, google=fake, billing=fake)

        t0 = time.monotonic()
        if how == "each asks":
            found = candidates(req, {"gcp": plugin("gcp")}, prepare=prepare, preflight=check)
        else:
            found = place(req, {"gcp": plugin("gcp")}, prepare=prepare, preflight=check).ranked
        measured[how] = (len(fake.calls), time.monotonic() - t0)
        assert len(set(zones)) >= 3 and all(c.dropped is None for c in found), [c.dropped for c in found]
    each, shared = measured["each asks"], measured["shared"]
    print(f"preflight of {len(zones)} gcp candidates in us-central1: {each[0]} API calls in {each[1]:.2f} s each "
          f"asking; {shared[0]} in {shared[1]:.2f} s shared")
    assert shared[0] * 2 <= each[0]


def test_gcp_buckets_are_looked_up_and_another_region_is_priced_inter_region(home):
    """`gs://` data in a us-central1 bucket (google_fake.FakeProject: buckets.get's location, objects.list
    paged 2 items at a time): europe-west4 candidates cross at gcp's inter-region price, us-central1 ones
    do not; the size counts only the objects under the prefix, every page."""
    from google_fake import Bucket, FakeProject

    from gpucluster.infra.gcp.bucket_facts import bucket_facts
    from gpucluster.infra.registry import plugin, readers
    from gpucluster.plan.placement import place
    from gpucluster.lifecycle.prepare import Request, prepare

    fake = FakeProject()
    fake.buckets["train-data"] = Bucket(objects={"set/a": 1_500_000_000, "set/b": 500_000_000, "set/c": 1_000_000_000,
                                                 "elsewhere/x": 9_000_000_000})
    assert bucket_facts("gs://train-data/set", google=fake) == ("us-central1", 3_000_000_000)
    facts = (lambda cloud: (lambda url: bucket_facts(url, google=fake)) if cloud == "gcp" else None)
    req = Request(cloud="gcp", region="auto", gpu="L4", nodes=1, dry_run=True, job=True, max_minutes=60,
                  project="my-proj-42", data=("gs://train-data/set",), readers=readers())
    refused = place(req, {"gcp": plugin("gcp")}, prepare=prepare, preflight=lambda plan: None, facts=facts)
    assert {c.region for c in refused.ranked} == {"us-central1"}
    assert any("reading it from gcp europe-west4 costs $0.02/GB inter-region egress: --allow-egress" in (c.dropped or "")
               for c in refused.dropped)
    allowed = place(req, {"gcp": plugin("gcp")}, prepare=prepare, preflight=lambda plan: None, facts=facts,
                    allow_egress=True)
    eu = [c for c in allowed.ranked if c.region == "europe-west4"]
    assert eu and all(c.egress is not None and c.egress.gb == Decimal("3.000") and c.egress.cost == Decimal("0.06")
                      for c in eu)
    fake.buckets["train-data"].location_type = "multi-region"  # a multi-region bucket has no one region
    assert bucket_facts("gs://train-data/set", google=fake) == (None, 3_000_000_000)
