"""Two users ("homes") in ONE AWS account: nothing of one is touched by the other's gpucluster.

The account is moto's server mode on loopback (`moto.server.ThreadedMotoServer`: the EC2 and IAM
query APIs over HTTP), which both homes reach through the standard AWS_ENDPOINT_URL ("Service-
specific endpoints", https://docs.aws.amazon.com/sdkref/latest/guide/feature-ss-endpoints.html);
the tag scans are the real ones (boto3). Each home drives the real Automation API driver against
its own FAKE Pulumi CLI (tests/pulumi_fake.py); when a fake `up` succeeds, the REAL aws program
runs under Pulumi's mocks for the spec the driver was given and what it declares is made in the
account with the declared tags and IAM paths (tests/aws_apply.py); a fake `destroy` deletes
exactly what that stack made, as `pulumi destroy` deletes what its state holds.

Two people at once: the users differ (LOGNAME) and so do the homes' installation ids. The shared
Pulumi state is a `file://` folder both fakes keep their stacks in (persist=True), with the
passphrase provider's rules (a passphrase is needed, and it must be the one the state was made
with).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))
pytest.importorskip("boto3")
pytest.importorskip("pulumi.automation")
pytest.importorskip("pulumi_aws")
pytest.importorskip("flask", reason="moto[server] is not installed (pip install 'moto[server]')")

import aws_apply  # noqa: E402
from pulumi_fake import FakePulumiCommand  # noqa: E402

from gpucluster.cli import common, down, gc, status, up  # noqa: E402
from gpucluster.errors import UsageError  # noqa: E402
from gpucluster.infra.pulumi.state import StateSecretsMissing  # noqa: E402

REGION = "us-east-1"
UP = ("--cloud", "aws", "--nodes", "2", "--instance-type", "g5.xlarge", "--region", REGION,
      "--ssh-cidr", "203.0.113.7/32", "--option", "ssm=true", "--yes")  # ssm: an IAM role and profile too


def invoke(cmd, *args):
    return cmd.main(list(args), prog_name=f"gpucluster {cmd.name}", standalone_mode=False)


class Account:
    """One AWS account (moto server) and the two users who share it."""

    def __init__(self, url: str, tmp: Path, monkeypatch):
        self.url, self.tmp, self.mp = url, tmp, monkeypatch
        self.made: dict[str, list[tuple[str, str]]] = {}  # stack -> what its `up` made in the account
        self.fakes: dict[str, FakePulumiCommand] = {}
        self.homes = {"alice": tmp / "home-alice", "bob": tmp / "home-bob"}
        self.who = "alice"

    def session(self):
        import boto3

        return boto3.session.Session(region_name=REGION)

    def be(self, user: str) -> None:
        """From now on, commands run as `user` in their own home."""
        self.who = user
        self.mp.setenv("GPUCLUSTER_HOME", str(self.homes[user]))
        self.mp.setenv("LOGNAME", user)
        self.mp.setenv("USER", user)

    def fake(self) -> FakePulumiCommand:
        if self.who not in self.fakes:
            from gpucluster.infra.aws import mock_runtime

            seen: dict = {}

            def on_up(stack):
                built = mock_runtime.build(seen[stack])
                assert built.error is None, built.error
                self.made[stack] = aws_apply.apply(built.recorder, self.session(), REGION)
                fake.scripted_outputs = {**fake.scripted_outputs, **built.outputs}

            def on_destroy(stack):
                aws_apply.destroy(self.made.pop(stack, []), self.session(), REGION)

            fake = FakePulumiCommand(on_up=on_up, on_destroy=on_destroy, persist=True)
            fake.seen = seen
            self.fakes[self.who] = fake
        return self.fakes[self.who]

    def provider(self, cloud: str, **scope):
        from gpucluster.infra.pulumi.engine import PulumiDriver
        from gpucluster.infra.pulumi.provider import PulumiProvider
        from gpucluster.infra.registry import plugin

        fake = self.fake()

        class Driver(PulumiDriver):
            def up(self, spec, events=None):
                fake.seen[spec.name] = spec
                return super().up(spec, events)

        # the real scans and deletes (boto3 against the account); STS and quota are not moto's
        return PulumiProvider(plugin(cloud), driver=Driver(pulumi_command=fake, program_runner=lambda s: None),
                              credentials=lambda region=None: [{"check": "aws credentials", "ok": True, "detail": "account"}],
                              cloud_checks=lambda spec: None).scoped(**scope)


@pytest.fixture
def account(tmp_path, monkeypatch):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    import urllib.request

    # moto keeps its accounts in this process: a fresh, empty account for each test (moto's reset API)
    urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/moto-api/reset", method="POST")).read()
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE",
                "PULUMI_CONFIG_PASSPHRASE_FILE", "GPUCLUSTER_STATE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{host}:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    acct = Account(f"http://{host}:{port}", tmp_path, monkeypatch)
    monkeypatch.setattr(common, "provider_for", acct.provider)
    acct.be("alice")
    yield acct
    server.stop()


def _json_out(capsys) -> object:
    """The JSON document a --json command printed (the console goes to stderr)."""
    return json.loads(capsys.readouterr().out)


def test_alices_cluster_survives_bobs_gc_down_and_name(account, capsys):
    from gpucluster.ownership import installation_id

    account.be("alice")
    assert invoke(up.up, *UP, "--json") == 0
    alice = json.loads(capsys.readouterr().out)
    name, alice_id = alice["cluster"], installation_id()
    assert name == f"gpucluster-aws-{alice_id[:4]}"  # the default name carries the owner's short id
    made = list(account.made[name])
    kinds = {k for k, _ in made}
    assert {"fleet", "launch-template", "instance", "vpc", "subnet", "security-group", "key-pair", "iam-role",
            "instance-profile"} <= kinds

    account.be("bob")
    bob_id = installation_id()
    assert bob_id != alice_id
    # bob's default name differs from alice's (shown in the plan)
    assert invoke(up.up, *UP, "--dry-run") == 0
    assert f"as cluster gpucluster-aws-{bob_id[:4]}" in capsys.readouterr().out

    # bob's gc: alice's resources are not his; listed with owner, user@host, age and $/hour, left alone
    assert invoke(gc.gc, "--cloud", "aws", "--region", REGION, "--yes", "--json") == 0
    report = _json_out(capsys)
    assert report["verdict"] == "verified" and report["deleted"] == [] and report["found"] == []
    foreign = {(f["kind"], f["id"]) for f in report["not_ours"]}
    iam = {m for m in made if m[0] in ("iam-role", "instance-profile")}
    assert set(made) - iam <= foreign
    assert not iam & foreign  # IAM is listed by owner (its path): bob's sweep never even lists hers
    inst = next(f for f in report["not_ours"] if f["kind"] == "instance")
    assert inst["owner"] == alice_id and inst["made_by"].startswith("alice@") and inst["hourly"] == "1.006"
    assert inst["since"] is not None
    assert aws_apply.exists(made, account.session()) == made

    # bob's `down` of the same name: his home has no such stack; his sweep is limited to his owner id
    assert invoke(down.down, name, "--cloud", "aws", "--yes", "--json") == 0
    (verdict,) = _json_out(capsys)
    assert verdict["verdict"] == "verified" and verdict["leftovers"] == []
    assert {(lo["kind"], lo["id"]) for lo in verdict["not_ours"]} >= set(made) - iam
    assert all(lo["owner"] == alice_id for lo in verdict["not_ours"])
    assert aws_apply.exists(made, account.session()) == made
    assert invoke(down.down, name, "--cloud", "aws", "--yes") == 0
    out = capsys.readouterr().out
    assert f"not touched: instance {inst['id']}: not ours (owner {alice_id}, alice@" in out

    # an explicit --name alice's cluster holds is refused before anything is created, naming her
    with pytest.raises(UsageError, match=rf"cluster name '{name}' is already held in {REGION} by another owner "
                                         rf"\(owner {alice_id}, alice@"):
        invoke(up.up, *UP, "--name", name)
    from gpucluster.ledger.store import Ledger

    assert Ledger.open_default().list_runs() == []  # nothing recorded, nothing created
    assert name not in account.made or account.made[name] == made

    # alice's own down removes it, and finds nothing of hers left
    account.be("alice")
    assert invoke(down.down, name, "--yes", "--json") == 0
    assert _json_out(capsys)[0]["verdict"] == "verified"
    assert aws_apply.exists(made, account.session()) == []


def test_bobs_run_teardown_leaves_alices_cluster_of_the_same_name(account, capsys):
    """A race the name check cannot close: alice's cluster of the same name lands after bob's check,
    while his `up` fails; his teardown destroys his stack and sweeps by tag, and the sweep leaves
    hers alone because it is not his (by owner id, not by name)."""
    from gpucluster.infra.aws import mock_runtime
    from gpucluster.ownership import owner_marks
    from gpucluster.spec import ClusterSpec

    account.be("alice")
    from gpucluster.ownership import installation_id

    alice_id = installation_id()
    hers = ClusterSpec(cloud="aws", nodes=2, name="lab", region=REGION, instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", run_id="r20261125-100000-aaaaaa", marks=owner_marks(alice_id))
    account.be("bob")
    fake = account.fake()

    def alice_lands(stack):  # alice's `up` of the same name creates at this moment
        account.made["lab-alice"] = aws_apply.apply(mock_runtime.build(hers).recorder, account.session(), REGION)

    fake.before_up = alice_lands
    fake.fail_up_after, fake.fail_text = 3, "error: creating EC2 Fleet: InsufficientInstanceCapacity: no capacity"
    with pytest.raises(Exception):
        invoke(up.up, *UP, "--name", "lab")
    made = account.made["lab-alice"]
    assert aws_apply.exists(made, account.session()) == made  # every one of hers is still there
    from gpucluster.ledger.store import Ledger

    (run,) = Ledger.open_default().list_runs()
    assert run.teardown == "verified"  # nothing of bob's is left
    out = capsys.readouterr().out
    assert f"left alone: instance" in out and f"owner {alice_id}" in out


def test_standalone_stacks_survive_gc_and_any_owner_unless_named(account, capsys, monkeypatch):
    """`pulumi up -s aws-g5` (the program's own entry, stacks/__main__.py) marks what it makes with
    the stack; gc never sweeps it, not even with --any-owner, unless it is named with --stack."""
    from gpucluster.infra import program
    from gpucluster.infra.aws import mock_runtime

    account.be("alice")
    config = {"gpucluster:cloud": "aws", "gpucluster:nodes": "1", "gpucluster:region": REGION,
              "gpucluster:instanceType": "g5.xlarge", "gpucluster:sshCidr": "203.0.113.7/32",
              "gpucluster:ssm": "true"}  # an IAM role too (made only for a reason)
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(config))  # how the engine hands a program its config
    built = mock_runtime.build(program=lambda: program.main() or {}, stack="aws-g5")
    assert built.error is None
    monkeypatch.delenv("PULUMI_CONFIG")
    made = aws_apply.apply(built.recorder, account.session(), REGION)
    assert {k for k, _ in made} >= {"fleet", "instance", "vpc", "iam-role"}

    for who in ("alice", "bob"):  # whether or not the stack was made from this home
        account.be(who)
        assert invoke(gc.gc, "--cloud", "aws", "--region", REGION, "--yes", "--json") == 0
        report = _json_out(capsys)
        assert report["deleted"] == [] and all(f.get("stack") == "gpucluster_aws-g5" for f in report["not_ours"]), report["not_ours"]
        assert invoke(gc.gc, "--cloud", "aws", "--region", REGION, "--any-owner", "--older-than", "0s", "--yes",
                      "--json") == 0
        assert _json_out(capsys)["deleted"] == []
        assert aws_apply.exists(made, account.session()) == made
    assert invoke(status.status, "--cloud", "aws", "--region", REGION) == 0
    assert "(standalone stack gpucluster_aws-g5, alice@" in capsys.readouterr().out
    # named, it goes
    assert invoke(gc.gc, "--cloud", "aws", "--region", REGION, "--stack", "aws-g5", "--yes", "--json") == 0
    report = _json_out(capsys)
    assert report["verdict"] == "verified" and {(f["kind"], f["id"]) for f in report["deleted"]} >= set(made)
    assert aws_apply.exists(made, account.session()) == []


def test_any_owner_needs_an_age_and_names_the_owners(account, capsys, monkeypatch):
    from gpucluster.ownership import installation_id

    account.be("alice")
    assert invoke(up.up, *UP, "--name", "old-one", "--json") == 0
    capsys.readouterr()
    alice_id = installation_id()
    made = list(account.made["old-one"])
    account.be("bob")
    with pytest.raises(UsageError, match="--any-owner also needs --older-than"):
        invoke(gc.gc, "--cloud", "aws", "--region", REGION, "--any-owner", "--yes")
    with pytest.raises(UsageError, match="--older-than '3 weeks' is not allowed"):
        invoke(gc.gc, "--cloud", "aws", "--region", REGION, "--any-owner", "--older-than", "3 weeks")
    # younger than asked: left alone
    assert invoke(gc.gc, "--cloud", "aws", "--region", REGION, "--any-owner", "--older-than", "1d", "--yes",
                  "--json") == 0
    assert _json_out(capsys)["deleted"] == [] and aws_apply.exists(made, account.session()) == made
    # the question names each owner whose resources would go (no terminal: it asks for --yes)
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    with pytest.raises(UsageError, match=rf"of owner\(s\) {alice_id} \(alice@[^)]*\): confirm with --yes"):
        invoke(gc.gc, "--cloud", "aws", "--region", REGION, "--any-owner", "--older-than", "0s")
    capsys.readouterr()
    assert aws_apply.exists(made, account.session()) == made
    assert invoke(gc.gc, "--cloud", "aws", "--region", REGION, "--any-owner", "--older-than", "0s", "--yes",
                  "--json") == 0
    report = _json_out(capsys)
    assert report["verdict"] == "verified" and aws_apply.exists(made, account.session()) == []


def test_up_from_one_home_and_down_from_another_through_a_shared_file_state(account, capsys, monkeypatch, tmp_path):
    from gpucluster.ownership import installation_id

    state = f"file://{tmp_path / 'team-state'}"
    (tmp_path / "team-state").mkdir()
    monkeypatch.setenv("GPUCLUSTER_STATE", state)
    # a shared state needs the team's passphrase: refused before anything is recorded or created
    account.be("alice")
    with pytest.raises(StateSecretsMissing, match="needs a passphrase every teammate uses.*PULUMI_CONFIG_PASSPHRASE"):
        invoke(up.up, *UP, "--name", "team-x")
    from gpucluster.ledger.store import Ledger

    assert Ledger.open_default().list_runs() == [] and account.made == {}
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "team-secret")
    assert invoke(up.up, *UP, "--name", "team-x", "--json") == 0
    capsys.readouterr()
    alice_id = installation_id()
    made = list(account.made["team-x"])
    (run,) = Ledger.open_default().list_runs()
    assert run.to_dict()["spec"]["state"] == state  # the ledger row says which state it used

    account.be("bob")  # another machine: no ledger row, no cluster.json, only the shared state
    assert invoke(status.status) == 0
    out = capsys.readouterr().out
    assert f"in the shared state: stack team-x (aws, owner {alice_id} (alice@" in out
    # not his: refused, naming her; nothing deleted
    assert invoke(down.down, "team-x", "--cloud", "aws", "--yes") == 2
    assert f"stack team-x was made by another owner ({alice_id}, alice@" in capsys.readouterr().out
    assert aws_apply.exists(made, account.session()) == made
    # with a wrong passphrase Pulumi cannot open the state (its owner cannot even be read): the destroy
    # fails, the tag sweep is bob's own, so nothing of alice's is touched; not verified (exit 3)
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "not-the-team-one")
    assert invoke(down.down, "team-x", "--cloud", "aws", "--yes") == 3
    assert "incorrect passphrase" in capsys.readouterr().out
    assert aws_apply.exists(made, account.session()) == made
    # the team's passphrase and --any-owner: the owners are named before the question; with no
    # terminal to ask on, it needs --yes and nothing goes
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "team-secret")
    monkeypatch.setattr(sys.stdin, "isatty", lambda: False)
    with pytest.raises(UsageError, match=r"Delete team-x and everything in it whoever made it: confirm with --yes"):
        invoke(down.down, "team-x", "--cloud", "aws", "--any-owner")
    out = capsys.readouterr().out
    import re

    assert re.search(rf"team-x: [1-9]\d* resource\(s\) found by tag, made by owner\(s\) {alice_id} \(alice@", out), out
    assert aws_apply.exists(made, account.session()) == made
    # destroyed through Pulumi, and said so
    assert invoke(down.down, "team-x", "--cloud", "aws", "--any-owner", "--yes") == 0
    out = capsys.readouterr().out
    assert f"Pulumi destroyed stack team-x (state {state})" in out and "team-x: down; verified" in out
    assert aws_apply.exists(made, account.session()) == []
    assert not (tmp_path / "team-state" / ".pulumi" / "stacks" / "gpucluster" / "team-x.json").exists()


def test_every_taggable_resource_both_programs_declare_carries_the_owner(home):
    """Walk what the aws and gcp programs declare under Pulumi's mocks: every resource whose
    provider class takes tags (aws) or labels (gcp) carries the owner marks; IAM roles and instance
    profiles carry them in their path too, the pods' Google service account in its description."""
    import inspect

    import pulumi_aws
    import pulumi_gcp

    from gpucluster.infra.aws import mock_runtime
    from gpucluster.infra.gcp.dryrun import _declare
    from gpucluster.ownership import installation_id, owner_marks
    from gpucluster.spec import ClusterSpec

    marks = owner_marks()
    owner = installation_id()

    def args_class(package, token: str):
        """The provider SDK's Args class of a resource type token (what the resource accepts)."""
        _, module, name = token.split(":")
        mod = package
        for part in module.split("/")[0].split("."):
            mod = getattr(mod, part)
        return getattr(mod, name + "Args")

    aws_spec = ClusterSpec(cloud="aws", nodes=2, name="walk", region=REGION, instance_type="g5.8xlarge",
                           ssh_cidr="203.0.113.7/32", run_id="r20261125-100000-bbbbbb", marks=marks,
                           options=(("efa", "true"),), reads=("s3://data/x",))
    built = mock_runtime.build(aws_spec)
    assert built.error is None
    checked = 0
    for r in built.recorder.resources:
        if not r.typ.startswith("aws:"):
            continue
        params = inspect.signature(args_class(pulumi_aws, r.typ).__init__).parameters
        if "tags" in params:
            tags = r.inputs.get("tags", {})
            assert tags.get("gpucluster-owner") == owner, r.typ
            assert tags["gpucluster-user"] == dict(marks)["gpucluster-user"], r.typ
            assert tags["gpucluster-host"] == dict(marks)["gpucluster-host"], r.typ  # who made it, where
            assert tags["gpucluster-run"] == aws_spec.run_id, r.typ  # and in which run
            checked += 1
        if r.typ in ("aws:iam/role:Role", "aws:iam/instanceProfile:InstanceProfile"):
            assert r.inputs["path"] == f"/gpucluster/{owner}/{REGION}/walk/"
    assert checked >= 12

    gcp_spec = ClusterSpec(cloud="gcp", nodes=2, name="walk", zone="us-central1-a", instance_type="n1-standard-16",
                           accelerator="nvidia-tesla-v100", gpus_per_node=4, run_id="r20261125-100000-cccccc",
                           marks=marks, project="my-proj", reads=("gs://data/x",))
    mocks, _ = _declare(gcp_spec)
    labelled = 0
    for r in mocks.resources:
        if not r.typ.startswith("gcp:"):
            continue
        params = inspect.signature(args_class(pulumi_gcp, r.typ).__init__).parameters
        for key in ("labels", "resource_labels"):
            camel = {"labels": "labels", "resource_labels": "resourceLabels"}[key]
            if key in params:
                labels = r.inputs.get(camel, {})
                assert labels.get("gpucluster-owner") == owner, r.typ
                assert labels["gpucluster-user"] == dict(marks)["gpucluster-user"], r.typ
                assert labels["gpucluster-host"] == dict(marks)["gpucluster-host"], r.typ
                assert labels["gpucluster-run"] == gcp_spec.run_id, r.typ
                labelled += 1
        if r.typ == "gcp:container/nodePool:NodePool":
            assert r.inputs["nodeConfig"]["resourceLabels"]["gpucluster-owner"] == owner
            assert r.inputs["nodeConfig"]["labels"]["gpucluster-owner"] == owner
        if r.typ == "gcp:serviceaccount/account:Account":
            assert f"gpucluster-owner={owner}" in r.inputs["description"]
            from gpucluster.infra.gcp.component_access import marks_from_description

            described = marks_from_description(r.inputs["description"])
            assert described["gpucluster-owner"] == owner and described["gpucluster-run"] == gcp_spec.run_id
            assert described["gpucluster-user"] == dict(marks)["gpucluster-user"]
            assert described["gpucluster-host"] == dict(marks)["gpucluster-host"]
    assert labelled >= 1
