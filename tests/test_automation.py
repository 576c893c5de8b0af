"""The Automation API driver and the cloud provider, against a recording FAKE of PulumiCommand
(tests/pulumi_fake.py: it records argv and returns scripted results; it is not Pulumi).

Scenarios: up -> outputs -> launch (stub) -> destroy through the real run lifecycle; up failing
halfway -> destroy and a capacity message with the next zone; Ctrl-C during up -> destroy; a
crashed run's ledger row finished by `gpucluster down`; stale and live locks; CLI missing or old;
the passphrase file's mode; the user's own backend.
"""

from __future__ import annotations

from gpucluster.infra.registry import plugin as backend_of
from gpucluster.infra.registry import plugin as _plugin

import os
import stat
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("pulumi.automation")

from pulumi_fake import FakePulumiCommand, aws_outputs  # noqa: E402

from gpucluster.errors import ConfigError, MissingDependency, ProvisionError, TeardownIncomplete  # noqa: E402
from gpucluster.infra.pulumi import cli as pulumi_cli, engine as automation, events as pulumi_events  # noqa: E402
from gpucluster.infra.pulumi.engine import PulumiDriver  # noqa: E402
from gpucluster.infra.pulumi.events import CapacityError  # noqa: E402
from gpucluster.infra.pulumi.provider import PulumiProvider  # noqa: E402
from gpucluster.domain import Leftover  # noqa: E402
from gpucluster.watch.launch import JobResult, JobSpec, Launcher, NodeResult  # noqa: E402
from gpucluster.ledger.store import Ledger  # noqa: E402
from gpucluster.watch.metrics import MetricsState  # noqa: E402
from gpucluster.ownership import installation_id  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402

CAPACITY = ("creating EC2 Instance: InsufficientInstanceCapacity: We currently do not have sufficient g5.xlarge "
            "capacity in the Availability Zone you requested (us-east-1a). Our system will be working on "
            "provisioning additional capacity. You can currently get g5.xlarge capacity by not specifying an "
            "Availability Zone in your request or choosing us-east-1b, us-east-1c, us-east-1d.")


class Recorder:
    def __init__(self):
        self.log = []

    def resource_requested(self, kind, name, **detail):
        self.log.append(("requested", kind, name))

    def resource_created(self, kind, name, cloud_id=None, **detail):
        self.log.append(("created", kind, name, cloud_id))

    def resource_deleted(self, kind, name, cloud_id=None):
        self.log.append(("deleted", kind, name))

    def message(self, text):
        self.log.append(("message", text))


def spec(**kw):
    base = dict(cloud="aws", nodes=2, name="demo", region="us-east-1", zone="us-east-1a", instance_type="g5.xlarge",
                ssh_cidr="203.0.113.7/32", run_id="r20261122-030000-abcdef")
    base.update(kw)
    return ClusterSpec(**base)


def provider(fake, leftovers=None, deleted=None, capacity_attempts=1):
    """A PulumiProvider on the fake CLI; the tag scan is a stub returning `leftovers` in turn.
    One attempt unless a test asks for capacity retries."""
    calls = list(leftovers or [])
    found: list = []

    def find(cloud, name=None, run_id=None, **kw):
        found.append((cloud, name, kw.get("regions")))
        return calls.pop(0) if calls else []

    def delete(items):
        (deleted if deleted is not None else []).append(list(items))
        return []

    p = PulumiProvider(_plugin("aws"), driver=PulumiDriver(pulumi_command=fake, program_runner=lambda s: None),
                       find=find, delete=delete, capacity_attempts=capacity_attempts,
                       credentials=lambda region=None: [{"check": "aws credentials", "ok": True, "detail": "account 123"}],
                       cloud_checks=lambda spec: None)
    p.found_calls = found
    return p


def verbs_after(fake, verb):
    v = fake.verbs()
    return v[v.index(verb) + 1:]


# -- the happy path, through the real lifecycle -------------------------------------------------------
class StubLauncher(Launcher):
    """Launch stub: records the cluster it was given; every node exits 0."""

    def __init__(self):
        self.cluster = None

    def launch(self, cluster, job, events, log_dir):
        self.cluster = cluster
        return JobResult(ok=True, nodes=[NodeResult(n.rank, n.host, 0) for n in cluster.nodes], metrics=MetricsState())


def test_up_outputs_launch_destroy(home, tmp_path):
    from gpucluster.lifecycle.steps import execute

    fake = FakePulumiCommand()
    prov = provider(fake)
    launcher = StubLauncher()
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    s = spec()
    outcome = execute(s, JobSpec(run_id=s.run_id, workload="digits"), backend=backend_of(s.cloud),
                      ledger=ledger, provider=prov,
                      launcher=launcher, log_dir=tmp_path / "logs")
    assert outcome.status == "succeeded" and outcome.teardown == "verified"

    # the argv sequence: stack per cluster, up with an event log, outputs with secrets, then the
    # robust teardown: refresh clearing pending creates, destroy continuing past errors, stack rm
    verbs = fake.verbs()
    assert verbs[:3] == ["stack select", "stack init", "up"]
    assert verbs.index("up") < verbs.index("refresh") < verbs.index("destroy") < verbs.index("stack rm")
    init = next(c for c in fake.calls if c[:2] == ["stack", "init"])
    assert init[2] == "demo" and init[init.index("--secrets-provider") + 1] == "passphrase"
    up = next(c for c in fake.calls if c[0] == "up")
    assert {"--yes", "--skip-preview", "--event-log"} <= set(up) and up[up.index("--stack") + 1] == "demo"
    assert any(c[:2] == ["stack", "output"] and "--show-secrets" in c for c in fake.calls)
    assert "--clear-pending-creates" in next(c for c in fake.calls if c[0] == "refresh")
    assert "--continue-on-error" in next(c for c in fake.calls if c[0] == "destroy")

    # outputs -> Cluster: head first, pinned host keys, the secret key (never in outputs)
    c = launcher.cluster
    assert [n.private_ip for n in c.nodes] == aws_outputs()["private_ips"]
    assert c.head.host == "203.0.113.10" and c.nodes[1].host_keys == ("ssh-ed25519 AAAAHOST1",)
    assert c.ssh_private_key.startswith("-----BEGIN OPENSSH") and "ssh_private_key" not in c.outputs

    # every billable resource recorded before and after creation, and confirmed gone
    run = ledger.get_run(s.run_id).to_dict()
    kinds = sorted(r["kind"] for r in run["resources"])
    assert kinds == ["instance", "instance", "key-pair", "security-group", "vpc"]  # the SG rule is not a resource row
    assert all(r["created_at"] and r["confirmed_gone"] for r in run["resources"])
    inst = next(r for r in run["resources"] if r["kind"] == "instance")
    assert inst["detail"]["instance_type"] == "g5.xlarge" and inst["cloud_id"].startswith("i-")

    # state lives under the gpucluster home: a file backend and a 0600 passphrase
    env = fake.envs[0]
    assert env["PULUMI_BACKEND_URL"] == (home / "pulumi" / "state").resolve().as_uri()
    pp = env["PULUMI_CONFIG_PASSPHRASE_FILE"]
    assert stat.S_IMODE(os.stat(pp).st_mode) == 0o600 and len(open(pp).read().strip()) >= 32
    # the leftover check ran in the spec's region, after the destroy
    assert prov.found_calls[-1] == ("aws", "demo", ["us-east-1"])
    assert automation.lock_owner("demo") is None  # released after down


def test_inline_program_runs_the_spec(home):
    seen = []
    fake = FakePulumiCommand()
    driver = PulumiDriver(provisioner=_plugin("aws").provisioner, pulumi_command=fake, program_runner=seen.append)
    stack = driver.stack("demo", lambda: driver.program_runner(spec()), create=True)
    stack.workspace.program()  # what the language server would call during `up`
    assert seen == [spec()]


# -- failures during up ---------------------------------------------------------------------------
def test_up_failing_halfway_destroys_and_names_the_next_zone(home):
    fake = FakePulumiCommand(fail_up_after=4, fail_text=CAPACITY)
    rec = Recorder()
    with pytest.raises(CapacityError) as err:
        provider(fake).up(spec(), rec)
    assert err.value.zone == "us-east-1a"
    assert err.value.suggested_zones[:3] == ["us-east-1b", "us-east-1c", "us-east-1d"]
    assert "us-east-1a" in err.value.message and "has been destroyed" in err.value.message
    assert "--zone us-east-1b" in err.value.hint
    after = [v for v in verbs_after(fake, "up") if v != "stack history"]
    assert after == ["refresh", "destroy", "stack rm"]
    assert fake.stacks == {}  # destroyed and removed
    created = [e for e in rec.log if e[0] == "created"]
    deleted = [e for e in rec.log if e[0] == "deleted"]
    assert len(created) == 3  # vpc, sg, key made; the rule is not recorded; the instance failed
    # destroyed: the three; the failed instance was requested, never created: confirmed gone by the scan
    assert sorted(e[2] for e in deleted) == ["demo-key", "demo-node-0", "demo-sg", "demo-vpc"]
    assert automation.lock_owner("demo") is None


def test_capacity_error_retries_in_the_next_zone_and_each_attempt_is_priced_in_the_ledger(home):
    from gpucluster.costing.cost import run_cost
    from gpucluster.ledger.store import Ledger
    from gpucluster.lifecycle.steps import QuietUI, _Recorder

    from gpucluster.infra.registry import plugin

    assert plugin("aws").provisioner.capacity_attempts == 3
    assert PulumiProvider(_plugin("aws")).capacity_attempts == 3
    fake = FakePulumiCommand(fail_up_after=4, fail_text=CAPACITY, fail_up_times=1)
    prov = provider(fake, capacity_attempts=plugin("aws").provisioner.capacity_attempts)
    zones = []
    real_up = prov.driver.up
    prov.driver.up = lambda s, ev=None: zones.append(s.zone) or real_up(s, ev)
    ledger = Ledger(home / "ledger.sqlite3")
    s = spec()
    ledger.create_run(s.run_id, cloud="aws", cluster="demo", nodes=2, gpus_per_node=1, command=["x"],
                      spec=s.to_dict())
    rec = _Recorder(ledger, s.run_id, QuietUI(), "us-east-1")
    messages = []
    rec.message = messages.append
    cluster = prov.up(s, rec)
    assert zones == ["us-east-1a", "us-east-1b"]  # the next zone AWS's message names
    retry = [m for m in messages if m.startswith("attempt 1 of 3: no capacity for g5.xlarge in us-east-1a")]
    assert cluster.nodes and len(retry) == 1 and retry[0].endswith("retrying in us-east-1b")
    rows = ledger.get_run(s.run_id).to_dict()["resources"]
    first = [r for r in rows if (r.get("detail") or {}).get("attempt") == 1]
    second = [r for r in rows if (r.get("detail") or {}).get("attempt") == 2]
    assert first and all(r["detail"]["zone"] == "us-east-1a" and r["confirmed_gone"] for r in first)
    assert second and all(r["detail"]["zone"] == "us-east-1b" for r in second)
    # the failed attempt's instance was requested, so it is priced (billing may start at request)
    lines = run_cost(ledger.get_run(s.run_id), backend=backend_of(s.cloud))["lines"]
    assert {ln["resource"] for ln in lines if ln["kind"] == "instance"} >= {"demo-node-0"}


def test_capacity_retries_stop_at_the_bound(home):
    fake = FakePulumiCommand(fail_up_after=4, fail_text=CAPACITY)  # every zone is out of capacity
    prov = provider(fake, capacity_attempts=2)
    rec = Recorder()
    with pytest.raises(CapacityError):
        prov.up(spec(), rec)
    assert fake.verbs().count("up") == 2
    assert fake.stacks == {}


def test_capacity_without_zone_list_asks_the_zone_lister(home):
    text = "error: creating EC2 Instance: InsufficientInstanceCapacity: no capacity in us-west-2b"
    err = pulumi_events.capacity_error(_plugin("aws").provisioner, spec(region="us-west-2", zone="us-west-2b"), text,
                                    zone_lister=lambda region, itype: ["us-west-2a", "us-west-2b", "us-west-2c"])
    assert err.zone == "us-west-2b" and err.suggested_zones == ["us-west-2a", "us-west-2c"]


def test_gke_stockout_suggests_v100_zones():
    s = ClusterSpec(cloud="gcp", nodes=2, name="demo", zone="us-central1-a", accelerator="nvidia-tesla-v100")
    err = pulumi_events.capacity_error(_plugin("gcp").provisioner, s, "googleapi: Error 403: ZONE_RESOURCE_POOL_EXHAUSTED in us-central1-a")
    assert err.zone == "us-central1-a"
    assert err.suggested_zones[0].startswith("us-central1-") and "us-central1-a" not in err.suggested_zones


def test_other_up_failure_destroys_and_says_why(home):
    fake = FakePulumiCommand(fail_up_after=1, fail_text="error: UnauthorizedOperation: not allowed to CreateVpc")
    with pytest.raises(ProvisionError, match="UnauthorizedOperation") as err:
        provider(fake).up(spec(), Recorder())
    assert not isinstance(err.value, CapacityError)
    assert "destroy" in verbs_after(fake, "up")


def test_ctrl_c_during_up_destroys_then_reraises(home):
    fake = FakePulumiCommand(interrupt_up_after=4)
    rec = Recorder()
    with pytest.raises(KeyboardInterrupt):
        provider(fake).up(spec(), rec)
    assert "destroy" in verbs_after(fake, "up")
    assert fake.stacks == {}
    assert ("message", "creating demo interrupted: destroying what was created") in rec.log


def test_failed_update_of_an_existing_cluster_leaves_it_alone(home):
    fake = FakePulumiCommand()
    prov = provider(fake)
    prov.up(spec(), Recorder())
    fake.fail_up_after, fake.fail_text = 0, CAPACITY
    rec = Recorder()
    with pytest.raises(ProvisionError, match="existing cluster 'demo' failed.*left running") as err:
        prov.up(spec(nodes=3), rec)
    assert "gpucluster down demo" in err.value.hint
    assert "destroy" not in fake.verbs() and len(fake.stacks["demo"]) == 6  # all still there


def test_ctrl_c_during_up_in_a_run_leaves_a_true_ledger_row(home, tmp_path):
    from gpucluster.lifecycle.steps import execute

    fake = FakePulumiCommand(interrupt_up_after=5)
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    s = spec()
    outcome = execute(s, JobSpec(run_id=s.run_id, workload="digits"), backend=backend_of(s.cloud),
                      ledger=ledger, provider=provider(fake),
                      launcher=StubLauncher(), log_dir=tmp_path / "logs")
    assert outcome.status == "interrupted" and outcome.teardown == "verified"
    run = ledger.get_run(s.run_id).to_dict()
    assert run["resources"] and all(r["confirmed_gone"] for r in run["resources"])
    assert ledger.open_resources("demo") == []


# -- a crash leaves a row that `gpucluster down` finishes ------------------------------------------
def test_crash_row_is_finished_by_down(home, monkeypatch, capsys):
    from gpucluster.cli import common
    from gpucluster.cli.down import down
    from gpucluster.lifecycle.steps import LedgerEvents

    fake = FakePulumiCommand()
    ledger = Ledger.open_default()
    s = spec()
    ledger.create_run(s.run_id, cloud="aws", cluster="demo", nodes=2, gpus_per_node=1, command=["train.py"],
                      spec=s.to_dict())
    events = LedgerEvents(ledger, "demo", s.run_id, s.region)
    provider(fake).up(s, events)  # ... and then the process "dies": no down, the row says running
    assert {r["kind"] for r in ledger.open_resources("demo")} == {"vpc", "security-group", "key-pair", "instance"}
    assert ledger.get_run(s.run_id).to_dict()["status"] == "running"

    monkeypatch.setattr(common, "provider_for", lambda cloud, **scope: provider(fake).scoped(**scope))
    rc = down.main(["demo", "--yes"], standalone_mode=False)
    out = capsys.readouterr().out
    assert rc == 0 and "verified" in out
    assert "destroy" in fake.verbs() and fake.stacks == {}
    assert ledger.open_resources("demo") == []
    run = ledger.get_run(s.run_id).to_dict()
    assert run["status"] == "failed" and run["teardown"] == "verified" and "ended before" in run["failure"]
    # idempotent: a second down has nothing to do and says so
    fake.calls.clear()
    assert down.main(["demo", "--yes"], standalone_mode=False) == 0
    assert "destroy" not in fake.verbs()


# -- down: locks, errors, idempotence -----------------------------------------------------------------
def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_down_of_unknown_stack_is_a_no_op(home):
    fake = FakePulumiCommand()
    assert PulumiDriver(provisioner=_plugin("aws").provisioner, pulumi_command=fake).destroy("never-made") is False
    assert fake.verbs() == ["stack select"]


def test_stale_pulumi_lock_is_cancelled(home):
    fake = FakePulumiCommand()
    driver = PulumiDriver(provisioner=_plugin("aws").provisioner, pulumi_command=fake, program_runner=lambda s: None)
    driver.up(spec(), Recorder())
    fake.locked_by_pid = dead_pid()
    rec = Recorder()
    assert driver.destroy("demo", rec) is True
    verbs = fake.verbs()
    assert verbs.index("cancel") < verbs.index("destroy")
    assert any("stale Pulumi lock" in e[1] for e in rec.log if e[0] == "message")


def test_live_pulumi_lock_is_not_cancelled(home):
    fake = FakePulumiCommand()
    driver = PulumiDriver(provisioner=_plugin("aws").provisioner, pulumi_command=fake, program_runner=lambda s: None)
    driver.up(spec(), Recorder())
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", "pulumi-up-stand-in"])
    try:
        fake.locked_by_pid = live.pid
        with pytest.raises(ProvisionError, match="locked by .*still running"):
            driver.destroy("demo", Recorder())
        assert "cancel" not in fake.verbs() and "destroy" not in fake.verbs()
    finally:
        live.kill()
        live.wait()


def test_another_live_gpucluster_process_owning_the_cluster_blocks_down(home):
    fake = FakePulumiCommand()
    owner = hold_owner_lock("demo")
    try:
        with pytest.raises(ProvisionError, match=f"in use by gpucluster process {owner.pid} \\(run, run r-holder"):
            PulumiDriver(provisioner=_plugin("aws").provisioner, pulumi_command=fake).destroy("demo")
        assert fake.calls == []  # nothing was run against the stack
        swept = []
        prov = provider(fake, deleted=swept)
        with pytest.raises(ProvisionError, match="in use"):
            prov.down("demo", Recorder())
        assert prov.found_calls == [] and swept == []  # and nothing deleted by tag from under it
    finally:
        owner.kill()
        owner.wait()
    # the owner died (SIGKILL): the kernel released its lock and down proceeds
    assert PulumiDriver(provisioner=_plugin("aws").provisioner, pulumi_command=fake).destroy("demo") is False


def hold_owner_lock(name: str) -> subprocess.Popen:
    """A real other process owning cluster `name` through gpucluster.lifecycle.owner (an fcntl lock)."""
    code = ("import sys, time\nfrom gpucluster.lifecycle.owner import owner_lock\n"
            "with owner_lock(sys.argv[1], 'run', run_id='r-holder'):\n    print('held', flush=True)\n    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, name], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_destroy_error_falls_back_to_the_tag_scan(home):
    fake = FakePulumiCommand()
    left = [Leftover("instance", "i-0000000000000000a", "us-east-1", owner=installation_id())]  # ours
    deleted: list = []
    prov = provider(fake, leftovers=[left, []], deleted=deleted)
    prov.up(spec(), Recorder())
    fake.fail_destroy_text = "error: deleting EC2 Instance (i-0000000000000000a): timeout while waiting"
    # the scan deleted what destroy could not; what Pulumi was deleting is never marked gone on the
    # strength of a tag scan alone, so the stack is destroyed again (issue 40 item 1): that destroy
    # succeeds, and it is Pulumi's record that confirms the rest gone
    rec = Recorder()
    prov.down("demo", rec)
    assert deleted == [left]
    assert fake.verbs().count("destroy") == 2
    assert any("destroying the stack again" in e[1] for e in rec.log if e[0] == "message")


def test_a_destroy_that_fails_twice_is_reported_even_when_the_tag_check_is_clean(home):
    fake = FakePulumiCommand()
    left = [Leftover("instance", "i-0000000000000000a", "us-east-1", owner=installation_id())]  # ours
    deleted: list = []
    prov = provider(fake, leftovers=[left, []], deleted=deleted)
    prov.up(spec(), Recorder())
    real_destroy = fake._destroy

    def always_fails(args, stack):
        fake.fail_destroy_text = "error: deleting EC2 Instance (i-0000000000000000a): timeout while waiting"
        return real_destroy(args, stack)

    fake._destroy = always_fails
    rec = Recorder()
    # a failed destroy is always reported: what Pulumi was deleting is never marked gone on the
    # strength of a tag scan alone
    with pytest.raises(TeardownIncomplete, match="destroying cluster 'demo' failed .*not confirmed gone"):
        prov.down("demo", rec)
    assert deleted == [left] and fake.verbs().count("destroy") == 2
    assert not [e for e in rec.log if e[0] == "deleted" and e[1] == "instance"]


def test_teardown_incomplete_names_what_is_left(home):
    fake = FakePulumiCommand()
    left = [Leftover("security-group", "sg-0b2", "us-east-1", owner=installation_id())]
    prov = provider(fake, leftovers=[left, left])
    prov.up(spec(), Recorder())
    with pytest.raises(TeardownIncomplete, match="security-group sg-0b2") as err:
        prov.down("demo", Recorder())
    assert "gpucluster gc --cloud aws" in err.value.hint


# -- the CLI and the home ---------------------------------------------------------------------------
def test_missing_cli_says_how_to_install(home, monkeypatch):
    monkeypatch.setattr(pulumi_cli.shutil, "which", lambda name: None)
    with pytest.raises(MissingDependency) as err:
        pulumi_cli.load_cli(None)
    assert "get.pulumi.com" in err.value.message and pulumi_cli.MIN_PULUMI_VERSION in err.value.message


def test_old_cli_is_refused_with_the_minimum(home):
    with pytest.raises(MissingDependency, match=r"3\.100\.0, older than the 3\.181\.0"):
        PulumiDriver(provisioner=_plugin("aws").provisioner, pulumi_command=FakePulumiCommand(version="3.100.0")).destroy("demo")


def test_passphrase_made_once_and_loose_mode_refused(home):
    first = pulumi_cli.passphrase_file()
    text = first.read_text()
    assert pulumi_cli.passphrase_file().read_text() == text  # generated once
    first.chmod(0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        pulumi_cli.passphrase_file()


def test_user_backend_and_passphrase_are_respected(home, monkeypatch):
    monkeypatch.setenv("PULUMI_BACKEND_URL", "s3://team-state")
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "theirs")
    env = pulumi_cli.workspace_env()
    assert env["PULUMI_BACKEND_URL"] == "s3://team-state" and "PULUMI_CONFIG_PASSPHRASE_FILE" not in env
    assert not (home / "pulumi" / "state").exists()


def test_a_shared_state_with_a_kms_key_needs_no_passphrase_and_reaches_pulumi(home, monkeypatch):
    """GPUCLUSTER_STATE=s3://... with GPUCLUSTER_SECRETS_PROVIDER=awskms://... (issue 24 item 6): the
    check before anything passes without a passphrase, Pulumi is pointed at the bucket, and the stack
    is made with the key as its secrets provider (`pulumi stack init --secrets-provider`, Pulumi's
    "Secrets handling": awskms://, gcpkms://, azurekeyvault://, hashivault://)."""
    from gpucluster.infra.pulumi.state import StateSecretsMissing, check_secrets

    for var in ("PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE", "PULUMI_BACKEND_URL",
                "GPUCLUSTER_SECRETS_PROVIDER"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("GPUCLUSTER_STATE", "s3://team-bucket/gpucluster")
    with pytest.raises(StateSecretsMissing, match="needs a passphrase every teammate uses"):
        check_secrets()  # neither a passphrase nor a key: refused
    key = "awskms://alias/team-pulumi?region=us-east-1"
    monkeypatch.setenv("GPUCLUSTER_SECRETS_PROVIDER", key)
    check_secrets()
    fake = FakePulumiCommand()
    provider(fake).up(spec(), Recorder())
    init = next(c for c in fake.calls if c[:2] == ["stack", "init"])
    assert init[init.index("--secrets-provider") + 1] == key
    assert all(env["PULUMI_BACKEND_URL"] == "s3://team-bucket/gpucluster" for env in fake.envs)
    assert not any("PULUMI_CONFIG_PASSPHRASE_FILE" in env or "PULUMI_CONFIG_PASSPHRASE" in env for env in fake.envs)
    assert not (home / "pulumi" / "state").exists()  # nothing of the home's own backend


def test_importing_the_driver_does_not_import_pulumi():
    code = ("import sys; import gpucluster.infra.pulumi.engine, gpucluster.infra.pulumi.provider, gpucluster.infra.leftovers, "
            "gpucluster.cli.down, gpucluster.cli.up, gpucluster.cli.gc, gpucluster.cli.doctor, "
            "gpucluster.infra.aws.leftovers, gpucluster.infra.gcp.leftovers, gpucluster.infra.aws.engine, "
            "gpucluster.infra.gcp.engine, gpucluster.infra.pulumi.cli, gpucluster.infra.pulumi.events; "
            "bad = [m for m in ('pulumi', 'boto3', 'google.cloud') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr


# -- the real PulumiCommand path, with a stand-in `pulumi` executable (a shell script, not Pulumi) --
STAND_IN = """#!/bin/sh
# FAKE `pulumi` for tests: prints a version, or waits for SIGINT like an update being cancelled
for a in "$@"; do
  case "$a" in
    version) echo "v3.190.0"; exit 0;;
    whoami) echo "pgid $(ps -o pgid= -p $$ | tr -d ' ')"; exit 0;;
    up) trap 'echo "error: update canceled" >&2; exit 255' INT; echo "Updating"; i=0
        while [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done; exit 0;;
  esac
done
echo "unscripted" >&2; exit 1
"""


@pytest.fixture
def stand_in_pulumi(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "pulumi"
    exe.write_text(STAND_IN)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return exe


def test_load_cli_runs_the_cli_in_its_own_session(home, stand_in_pulumi):
    cmd = pulumi_cli.load_cli(None)
    assert str(cmd.version) == "3.190.0"
    out = cmd.run(["whoami"], str(stand_in_pulumi.parent), {}).stdout
    assert int(out.split()[1]) != os.getpgrp()  # a terminal Ctrl-C does not reach it directly


def test_ctrl_c_is_forwarded_to_a_running_update(home, stand_in_pulumi):
    import signal
    import threading
    import time

    cmd = pulumi_cli.load_cli(None)
    timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    start = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            cmd.run(["up"], str(stand_in_pulumi.parent), {})
    finally:
        timer.cancel()
    assert time.monotonic() - start < 5  # the CLI got SIGINT and stopped, not the full 10 s


# -- the real AWS program, run under Pulumi's mocks, replayed through the driver --------------------
def test_real_aws_program_through_the_driver(home, tmp_path, monkeypatch):
    """What `infra.program.run(spec)` declares and exports (under pulumi's mock runtime) is what
    the fake CLI replays as engine events and outputs: the driver must turn it into a head-first
    Cluster and ledger rows the cost code can price."""
    pytest.importorskip("pulumi_aws")
    from gpucluster.infra.aws import mock_runtime as aws_mocks

    s = spec(nodes=3, zone=None)
    built = aws_mocks.build(s)
    assert built.error is None
    resources = [(r.typ, r.name, f"{r.name}-id") for r in built.recorder.resources]
    fake = FakePulumiCommand(resources=resources, outputs=built.outputs,
                             secret_keys=[k for k, v in built.secret.items() if v])
    fake.inputs = {r.name: {k: aws_mocks.unwrap(v) for k, v in r.inputs.items()} for r in built.recorder.resources}
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    ledger.create_run(s.run_id, cloud="aws", cluster="demo", nodes=3, gpus_per_node=1, command=["x"], spec=s.to_dict())
    from gpucluster.lifecycle.steps import LedgerEvents

    # the nodes' host keys come from their serial consoles (infra/aws/hostkeys.py; tests/test_aws_fleet.py)
    from gpucluster.infra.aws import hostkeys

    class Console:
        def get_console_output(self, InstanceId, Latest):  # noqa: N803 - boto3's names
            text = f"-----BEGIN SSH HOST KEY KEYS-----\nssh-ed25519 AAAA{InstanceId[-3:]} root@n\n-----END SSH HOST KEY KEYS-----\n"
            return {"Output": __import__("base64").b64encode(text.encode()).decode()}

    monkeypatch.setattr(hostkeys, "client_for", lambda region: Console())
    cluster = provider(fake).up(s, LedgerEvents(ledger, "demo", s.run_id, s.region))
    assert [n.rank for n in cluster.nodes] == [0, 1, 2]
    assert [n.private_ip for n in cluster.nodes] == [aws_mocks.private_ip(i) for i in range(3)]
    assert cluster.nodes[2].host_keys == ("ssh-ed25519 AAAA" + built.outputs["instance_ids"][2][-3:],)
    assert cluster.ssh_private_key == built.outputs["ssh_private_key"] and "ssh_private_key" not in cluster.outputs

    rows = ledger.get_run(s.run_id).to_dict()["resources"]
    kinds = sorted({r["kind"] for r in rows})
    assert {"fleet", "launch-template", "security-group", "key-pair", "placement-group", "vpc", "subnet"} <= set(kinds)
    assert not {"iam-role", "instance-profile"} & set(kinds)  # a default run creates no IAM (issue 25)
    assert "instance" not in kinds  # the nodes are one fleet row (issue 25: all in one request)
    (fleet,) = [r for r in rows if r["kind"] == "fleet"]
    assert fleet["created_at"]
    d = fleet["detail"]
    assert (d["instance_type"], d["node_count"], d["disk_gb"], d["disk_type"], d["spot"]) == (
        "g5.xlarge", 3, 100, "gp3", False)
    # the zone it launched in (the subnet's, set on the instance: spot is priced by zone) and its public IPv4
    assert d["availability_zone"] == built.outputs["availability_zone"] and d["public_ipv4"] == 1
    try:
        from gpucluster.costing import cost
    except ImportError:
        return
    priced = cost.run_cost(ledger.get_run(s.run_id), backend=backend_of(s.cloud))
    assert {ln["category"] for ln in priced["lines"]} >= {"instances", "disks"}


def test_gke_node_pool_inputs_become_priceable_detail():
    """The GCP program's real NodePool/Cluster inputs (pulumi mocks) -> the ledger detail."""
    pulumi = pytest.importorskip("pulumi")
    pytest.importorskip("pulumi_gcp")
    from test_gcp_infra import CLUSTER, POOL, RecordingMocks, declare
    from test_gcp_infra import spec as gcp_spec

    mocks = RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project="gpucluster", stack="gcp-v100", preview=False)
    s = gcp_spec()
    seen = {}

    @pulumi.runtime.test
    def go():
        outputs = declare(s)

        def check(_):
            pools = {r.inputs["name"]: _plugin("gcp").provisioner.resource_detail("node-pool", r.inputs, s) for r in mocks.of_type(POOL)}
            seen["pools"] = pools
            seen["cluster"] = _plugin("gcp").provisioner.resource_detail("gke-cluster", mocks.of_type(CLUSTER)[0].inputs, s)

        return pulumi.Output.all(*outputs.values()).apply(check)

    go()
    gpu = [d for d in seen["pools"].values() if d["gpus_per_node"]]
    assert len(gpu) == 1
    d = gpu[0]
    assert (d["machine_type"], d["node_count"], d["gpus_per_node"], d["accelerator"]) == (
        "n1-standard-16", 2, 4, "nvidia-tesla-v100")
    assert (d["disk_gb"], d["disk_type"]) == (200, "pd-ssd")
    assert seen["cluster"] == {"location": "us-central1-a", "zonal": True}


def test_gcp_provider_outputs_and_scan_project(home):
    pytest.importorskip("pulumi_gcp")
    outputs = {"cluster_name": "v100", "location": "us-central1-a", "endpoint": "203.0.113.10",
               "kubeconfig": "apiVersion: v1\nkind: Config\n", "node_pool_name": "v100-gpu",
               "machine_type": "n1-standard-16", "accelerator_type": "nvidia-tesla-v100", "accelerator_count": 4,
               "gpus_per_node": 4, "nodes": 2}
    fake = FakePulumiCommand(resources=[("gcp:container/cluster:Cluster", "v100", "projects/p/locations/z/clusters/v100"),
                                        ("gcp:container/nodePool:NodePool", "v100-gpu", "pool-id")],
                             outputs=outputs, secret_keys=["kubeconfig"])
    asked = []

    def find(cloud, name=None, run_id=None, **kw):
        asked.append((cloud, name, kw))
        return []

    prov = PulumiProvider(_plugin("gcp"), driver=PulumiDriver(pulumi_command=fake, program_runner=lambda s: None),
                          find=find, delete=lambda items: [])
    s = ClusterSpec(cloud="gcp", nodes=2, name="v100", zone="us-central1-a", instance_type="n1-standard-16",
                    accelerator="nvidia-tesla-v100", gpus_per_node=4, project="my-proj")
    rec = Recorder()
    cluster = prov.up(s, rec)
    assert cluster.cloud == "gcp" and cluster.kubeconfig.startswith("apiVersion") and "kubeconfig" not in cluster.outputs
    assert cluster.gpus_per_node == 4 and cluster.zone == "us-central1-a"
    assert [e[1] for e in rec.log if e[0] == "created"] == ["gke-cluster", "node-pool"]
    prov.down("v100", rec)
    assert asked[-1] == ("gcp", "v100", {"project": "my-proj", "owner": installation_id()})


def test_down_without_a_pulumi_cli_still_deletes_by_tag(home, monkeypatch):
    monkeypatch.setattr(pulumi_cli.shutil, "which", lambda name: None)
    left = [Leftover("instance", "i-0000000000000000a", "us-east-1", owner=installation_id())]
    deleted: list = []
    prov = PulumiProvider(_plugin("aws"), driver=PulumiDriver(), find=lambda cloud, **kw: left if not deleted else [],
                          delete=lambda items: deleted.append(items) or [])
    rec = Recorder()
    with pytest.raises(TeardownIncomplete, match="not on PATH.*the tag check found nothing"):
        prov.down("demo", rec)
    assert deleted == [left]
    assert any("deleting by tag instead" in e[1] for e in rec.log if e[0] == "message")


def test_up_failure_whose_cleanup_also_fails_says_how_to_finish(home):
    fake = FakePulumiCommand(fail_up_after=4, fail_text=CAPACITY, fail_destroy_text="error: DependencyViolation")
    with pytest.raises(CapacityError) as err:
        PulumiDriver(provisioner=_plugin("aws").provisioner, pulumi_command=fake, program_runner=lambda s: None).up(spec(), Recorder())
    msg = err.value.message
    assert "cleanup did not finish" in msg and "gpucluster down demo" in msg and "gc --cloud aws" in msg
    assert "has been destroyed" not in msg


def test_preflight_refuses_missing_credentials_before_anything(home):
    """The provider's preflight (before the ledger row) fails on the cloud's credential check alone,
    naming it and its fix; other failed doctor checks (quota) are `gpucluster doctor`'s business."""
    from gpucluster.errors import UsageError

    fake = FakePulumiCommand()
    checks = [{"check": "aws credentials", "ok": False, "detail": "STS get_caller_identity failed: expired token",
               "fix": "`aws sso login`"}, {"check": "EC2 G/VT vCPU quota (us-east-1)", "ok": False, "detail": "0"}]
    p = PulumiProvider(_plugin("aws"), driver=PulumiDriver(pulumi_command=fake, program_runner=lambda s: None),
                       credentials=lambda region=None: checks)
    with pytest.raises(UsageError, match=r"aws credentials: STS get_caller_identity failed: expired token; "
                                         r"nothing was started: `aws sso login`"):
        p.preflight()
    checks.pop(0)
    p.preflight()  # a quota problem alone does not stop a run here
    assert not fake.calls or all(c[0] != "up" for c in fake.calls)


def test_up_of_an_existing_stack_refreshes_it_first(home):
    """issue 26: a cluster deleted outside Pulumi (or left half-destroyed) is still in the stack's state;
    `up` refreshes the state before the update, so Pulumi recreates what is gone instead of trusting it."""
    fake = FakePulumiCommand()
    prov = provider(fake)
    prov.up(spec(), Recorder())
    assert "refresh" not in fake.verbs()  # a new stack has nothing to refresh
    before = len(fake.verbs())
    prov.up(spec(), Recorder())
    again = fake.verbs()[before:]
    assert "refresh" in again and again.index("refresh") < again.index("up")
