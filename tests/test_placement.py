"""Placement (issue 43, docs/placement.md): `--cloud auto|A,B` and `--region auto|A,B` rank every
candidate by the run's full estimated cost before anything is created; `--max-hourly` drops those
above it; bad input is one line, exit 2, nothing created."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from types import SimpleNamespace

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

NO_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "GOOGLE_APPLICATION_CREDENTIALS",
                  "GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT")


@pytest.fixture
def cli(home, monkeypatch, tmp_path, capsys):
    """The CLI in-process, with no cloud credentials anywhere it could look."""
    for name in NO_CREDENTIALS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("COLUMNS", "200")
    from gpucluster.cli.main import main

    def invoke(*args: str):
        code = main(list(args))  # the entry point: errors become one line and an exit code
        out, err = capsys.readouterr()
        return SimpleNamespace(exit_code=code, output=out + err, stdout=out, stderr=err)

    return invoke


def _estimate(cli, *args: str) -> dict:
    res = cli("cost", "estimate", *args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.mark.parametrize("nodes, first", [(1, "aws"), (4, "gcp")])
def test_gke_fixed_fees_make_aws_cheaper_for_one_node_and_gcp_for_four(cli, nodes, first):
    # GKE adds a cluster fee ($0.10/h, GKE pricing) and a system pool to every cluster, whatever
    # its size: one g6.xlarge (L4) beats one g2-standard-4 + fees, four do not (prices.json rows)
    placed = _estimate(cli, "--cloud", "aws,gcp", "--gpu", "L4", "--nodes", str(nodes))
    assert placed["chosen"]["cloud"] == first
    ranked = placed["candidates"]
    assert [Decimal(c["total"]) for c in ranked] == sorted(Decimal(c["total"]) for c in ranked)
    assert {c["cloud"] for c in ranked} == {"aws", "gcp"}
    for c in ranked:
        assert set(c) >= {"cloud", "region", "zones", "instance_type", "hourly", "total"}
        # each candidate is priced exactly as the one-cloud `cost estimate` prices it, fixed fees included
        alone = _estimate(cli, "--cloud", c["cloud"], "--region", c["region"], "--gpu", "L4", "--nodes", str(nodes),
                          "--instance-type", c["instance_type"], *(("--zone", c["zones"][0]) if c["zones"] else ()))
        assert Decimal(c["total"]) == Decimal(alone["total"])
        assert c["instance_type"] == alone["instance_type"]
    gcp = next(c for c in ranked if c["cloud"] == "gcp")
    gke = _estimate(cli, "--cloud", "gcp", "--region", gcp["region"], "--gpu", "L4", "--nodes", str(nodes))
    assert any(line["category"] == "cluster fee" for line in gke["lines"])  # the fee is in the ranked total


def test_dry_run_ranks_both_clouds_without_credentials_and_marks_what_it_did_not_check(cli):
    res = cli("run", "--cloud", "aws,gcp", "--gpu", "L4", "--nodes", "4", "--max-minutes", "60", "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["chosen"]["cloud"] == "gcp" and d["chosen"] == d["candidates"][0]
    assert len(d["candidates"]) >= 3 and not d["dropped"]
    assert all("credentials" in c["not_checked"] and "quota" in c["not_checked"] for c in d["candidates"])
    assert d["instance_type"] == d["chosen"]["instance_type"]  # the plan is the chosen candidate's
    assert "placement:" in res.stderr and "not checked: credentials" in res.stderr


def test_region_auto_within_one_cloud_and_a_region_list(cli):
    placed = _estimate(cli, "--cloud", "aws", "--region", "auto", "--gpu", "L4")
    assert {c["region"] for c in placed["candidates"]} == {"us-east-1", "us-west-2"}
    listed = _estimate(cli, "--cloud", "aws,gcp", "--region", "us-west-2,europe-west4", "--gpu", "L4")
    assert {(c["cloud"], c["region"]) for c in listed["candidates"]} == {("aws", "us-west-2"), ("gcp", "europe-west4")}


def test_max_hourly_drops_candidates_above_it_and_says_so(cli):
    placed = _estimate(cli, "--cloud", "aws,gcp", "--gpu", "L4", "--nodes", "1", "--max-hourly", "0.95")
    assert all(Decimal(c["hourly"]) <= Decimal("0.95") for c in placed["candidates"])
    assert placed["dropped"] and all("above --max-hourly $0.95" in c["dropped"] for c in placed["dropped"])


@pytest.mark.parametrize("args, named", [
    (("--cloud", "aws,azure"), "'azure'"),
    (("--cloud", "aws,local"), "'local'"),
    (("--cloud", "aws,,gcp"), "'aws,,gcp'"),
    (("--cloud", "aws,gcp", "--region", "us-east-1,mars-1"), "'mars-1'"),
    (("--cloud", "auto", "--max-hourly", "cheap"), "'cheap'"),
    (("--cloud", "auto", "--max-hourly", "0.10"), "no candidate is left"),
    (("--cloud", "auto", "--max-attempts", "0"), "max attempts"),
    (("--cloud", "aws,gcp", "--instance-type", "g6.xlarge"), "g6.xlarge"),
    (("--cloud", "auto", "--project", "P"), "'P'"),  # the user's to fix: not a reason to place on aws
    (("--cloud", "auto", "--hosts", "a@b"), "--hosts"),
    (("--cloud", "auto", "--workload", "nope"), "workload 'nope' is not allowed"),  # one line, not 4 drops
])
def test_bad_placement_input_is_one_line_exit_2_and_creates_nothing(cli, home, args, named):
    res = cli("run", *args, "--gpu", "L4", "--nodes", "1", "--dry-run")
    assert res.exit_code == 2, res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and named in lines[0] and "Traceback" not in res.output
    assert not (home / "ledger.sqlite3").exists()


def test_no_candidate_left_lists_every_reason(cli):
    res = cli("cost", "estimate", "--cloud", "auto", "--gpu", "L4", "--max-hourly", "0.5")
    assert res.exit_code == 2
    for where in ("aws us-east-1", "aws us-west-2", "gcp us-central1"):
        assert where in res.output
    assert "above --max-hourly $0.5" in res.output


def test_a_real_run_drops_what_preflight_refuses_with_the_reason(home):
    """Outside a dry run each candidate is asked the cloud's preflight; a refusal (here: no aws
    credentials, as aws's preflight words it) drops it, and the next is chosen."""
    from gpucluster.errors import UsageError
    from gpucluster.infra.registry import plugin
    from gpucluster.plan.placement import place
    from gpucluster.lifecycle.prepare import Request, prepare

    def preflight(plan):
        if plan.spec.cloud == "aws":
            raise UsageError("aws credentials: none found (looked in the environment, ~/.aws); run `aws configure`")

    req = Request(cloud="aws,gcp", gpu="L4", nodes=1, dry_run=True, job=False)
    placed = place(req, {c: plugin(c) for c in ("aws", "gcp")}, prepare=prepare, preflight=preflight)
    assert placed.chosen.cloud == "gcp"
    assert placed.dropped and all(c.cloud == "aws" and "credentials" in (c.dropped or "") for c in placed.dropped)
    assert all(not c.not_checked for c in placed.ranked)  # asked: not "not checked"


def test_cloud_only_flags_go_to_the_clouds_that_take_them(cli):
    """--project is gcp's and --ssh-cidr aws's: each candidate gets its own, none is dropped for the other's."""
    res = cli("run", "--cloud", "auto", "--gpu", "L4", "--nodes", "1", "--project", "my-project-1",
              "--ssh-cidr", "203.0.113.7/32", "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert {c["cloud"] for c in d["candidates"]} == {"aws", "gcp"} and not d["dropped"]


def test_up_places_as_run_does(cli):
    res = cli("up", "--cloud", "auto", "--gpu", "L4", "--nodes", "4", "--dry-run", "--json")
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["chosen"]["cloud"] == "gcp" and d["instance_type"] == d["chosen"]["instance_type"]


def test_a_sweep_keeps_one_placement_chosen_for_its_largest_size(cli, monkeypatch):
    """--nodes 1,4: ranked for 4 nodes (gcp first; for 1 node aws would be). The sweep is stopped where
    its ledger is opened, after the placement (the preflight stubbed: it is a cloud's)."""
    import gpucluster.lifecycle.prepare as prepare_mod
    from gpucluster.errors import UsageError

    seen = []
    monkeypatch.setattr(prepare_mod, "check_before_recording", lambda plan: seen.append(plan.spec.nodes))

    def stop():
        raise UsageError("stopped here by the test")

    monkeypatch.setattr(prepare_mod, "open_ledger", stop)
    res = cli("sweep", "--cloud", "aws,gcp", "--gpu", "L4", "--nodes", "1,4", "--project", "my-project-1",
              "--ssh-cidr", "203.0.113.7/32", "--", "python", "-c", "pass")
    assert res.exit_code == 2 and "stopped here by the test" in res.stderr, res.output
    assert seen and set(seen) == {4}  # every candidate checked for the largest size


@pytest.mark.parametrize("where", ["task file", "environment", "config file"])
def test_auto_and_lists_are_taken_from_the_task_file_the_environment_and_the_config(cli, monkeypatch, tmp_path, where):
    args = ["run", "--gpu", "L4", "--nodes", "4", "--dry-run", "--json"]
    if where == "task file":
        (tmp_path / "task.yaml").write_text("resources:\n  cloud: aws,gcp\nrun: python -c pass\n")
        args.insert(1, str(tmp_path / "task.yaml"))
    elif where == "environment":
        monkeypatch.setenv("GPUCLUSTER_CLOUD", "auto")
    else:
        (tmp_path / "config.yaml").write_text("cloud: auto\n")
        monkeypatch.setenv("GPUCLUSTER_CONFIG", str(tmp_path / "config.yaml"))
    res = cli(*args)
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["chosen"]["cloud"] == "gcp" and {c["cloud"] for c in d["candidates"]} == {"aws", "gcp"}


@pytest.fixture
def offline_clouds(monkeypatch):
    """No metadata server answers (this machine is no EC2 instance or GCE VM): botocore's and
    google.auth's own switches, so the chains end at once as they do off-cloud."""
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)


def test_cloud_auto_with_no_credentials_at_all_is_exit_2_naming_what_was_looked_for(cli, home, offline_clouds):
    res = cli("run", "--cloud", "auto", "--gpu", "L4", "--nodes", "1", "--yes")
    assert res.exit_code == 2, res.output
    (line,) = [ln for ln in res.output.splitlines() if ln.strip()]
    assert "no cloud's credentials were found" in line
    assert "~/.aws/credentials" in line and "GOOGLE_APPLICATION_CREDENTIALS" in line
    assert not (home / "ledger.sqlite3").exists()


def test_cloud_auto_places_only_on_the_clouds_whose_credentials_are_found(cli, monkeypatch, offline_clouds):
    """aws keys in the environment (botocore's EnvProvider), no Google ADC: gcp is dropped, said in the table;
    the run is stopped by the test where its ledger opens (the cloud's preflight stubbed: it calls AWS)."""
    import gpucluster.lifecycle.prepare as prepare_mod
    from gpucluster.errors import UsageError

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setattr(prepare_mod, "check_before_recording", lambda plan: None)

    def stop():
        raise UsageError("stopped here by the test")

    monkeypatch.setattr(prepare_mod, "open_ledger", stop)
    res = cli("run", "--cloud", "auto", "--gpu", "L4", "--nodes", "4", "--ssh-cidr", "203.0.113.7/32", "--yes")
    assert res.exit_code == 2 and "stopped here by the test" in res.stderr, res.output
    assert "dropped: no Google application-default credentials" in res.output
    assert "gpucluster-aws-" in res.output  # the plan is aws's, though gcp is cheaper for 4 nodes
