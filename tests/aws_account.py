"""An AWS account that keeps time, with the REAL provider and driver on the FAKE Pulumi CLI (test-only;
used by tests/test_aws_teardown.py and tests/test_aws_update.py).

The account is moto's EC2 and IAM in this process with the timed EC2 in front of it
(tests/ec2_timed.py: instances `pending -> running -> shutting-down -> terminated`, 60-120 s to
terminate as GPU instances take, public IPs only once running, the in-use refusals of the real
service, a new instance profile EC2 does not see for a while, no ModifyFleet of an instant fleet), on
a clock scaled 20:1 (the code's own sleeps, given that clock, pass at once). The REAL driver runs
against the FAKE Pulumi CLI (tests/pulumi_fake.py); its `up` makes in the account what the REAL aws
program declares (tests/aws_apply.py, placement group included), as an update of what the stack
already holds when it holds something (`aws_apply.apply` with the stack's state: same inputs kept,
changed ones updated in place or replaced as the program's options and the provider say, the
`--replace` URNs replaced), then does what the program does once the fleet is made: fewer nodes
than asked fails the update naming EC2's errors (`engine.fleet_instance_ids`, DescribeFleets). It
exports what the program reads back at the end of `up` (`aws.ec2.get_instance` of each node: while
a node is `pending` it has no public IP). Its `destroy` deletes as pulumi-aws does
(`aws_apply.destroy_as_provider`: the instant fleet's delete does not wait for its instances; the
placement group's delete is not retried; security group, subnet, gateway and VPC deletes retry
DependencyViolation). The tag scans and deletes are the real ones (boto3).
"""

from __future__ import annotations

from typing import Any

import pytest

import aws_apply
from ec2_timed import ScaledClock, TimedEc2
from pulumi_fake import AWS_FLEET_RESOURCES, FakePulumiCommand, aws_outputs

REGION = "us-east-1"


class Account:
    """moto's account behind the timed EC2, the fake Pulumi CLI, and the real provider on them."""

    def __init__(self, timed: TimedEc2):
        import boto3

        self.timed = timed
        self.session = boto3.session.Session(region_name=REGION)
        self.made: dict[str, list[tuple[str, str]]] = {}
        self.states: dict[str, dict[str, Any]] = {}  # stack -> what its Pulumi state holds (aws_apply.apply)
        self.seen: dict[str, object] = {}
        self.built: dict[tuple[str, str], Any] = {}  # (stack, run id) -> what the program declared
        self.fake = FakePulumiCommand(on_up=self.on_up, on_destroy=self.on_destroy, destroy_in_account=True,
                                      up_in_account=True, resources=AWS_FLEET_RESOURCES)

    def on_up(self, stack: str) -> None:
        from gpucluster.infra.aws import engine, mock_runtime

        spec: Any = self.seen[stack]
        key = (stack, spec.run_id)
        if key not in self.built:  # the same spec declares the same (the mock runtime takes a second or two)
            self.built[key] = mock_runtime.build(spec)
        built = self.built[key]
        assert built.error is None, built.error
        # `--replace URN`: the program's resources of that type (the fake's URNs name its own resources)
        types = {urn.split("::")[2].rsplit("$", 1)[-1] for urn in self.fake.replaced[-1]}
        replace = tuple(r.name for r in built.recorder.resources if r.typ in types)
        state = self.states.setdefault(stack, {})
        made = self.made[stack] = []  # filled as they are made: a failed create leaves the others in the stack
        aws_apply.apply(built.recorder, self.session, REGION, state=state, replace=replace, made=made)
        ec2 = aws_apply.client(self.session, "ec2", REGION)
        fleet = next(v for v in state.values() if v["kind"] == "fleet")
        # the program, once the fleet is made: fewer nodes than asked fails the update with EC2's errors
        ids = engine.fleet_instance_ids([{"instanceIds": fleet["members"]}], spec.nodes, fleet_id=fleet["id"],
                                        region=REGION, errors_of=lambda r, f: engine.fleet_errors(r, f, client=ec2))
        assert sorted(ids) == sorted(i for k, i in made if k == "instance")
        by_id = {i["InstanceId"]: i for r in ec2.describe_instances(InstanceIds=ids)["Reservations"]
                 for i in r["Instances"]}
        # what the program exports: each node as aws.ec2.get_instance reads it right after CreateFleet
        # (DescribeInstances; a pending instance has no public IP: publicIp "")
        self.fake.scripted_outputs = {
            **aws_outputs(len(ids)), **built.outputs, "instance_ids": ids, "fleet_id": fleet["id"],
            "private_ips": [by_id[i].get("PrivateIpAddress", "") for i in ids],
            "public_ips": [by_id[i].get("PublicIpAddress", "") for i in ids],
            "host_public_keys": [f"ssh-ed25519 AAAAHOST{n}" for n in range(len(ids))]}

    def on_destroy(self, stack: str) -> None:
        made = self.made.get(stack, [])
        try:
            aws_apply.destroy_as_provider(made, self.session, REGION, sleep=self.timed.clock.sleep,
                                          now=self.timed.clock.now)
        finally:  # the state keeps what the destroy did not delete
            left = set(made)
            self.states[stack] = {n: v for n, v in self.states.get(stack, {}).items() if (v["kind"], v["id"]) in left}

    def provider(self) -> Any:
        from gpucluster.infra.pulumi.engine import PulumiDriver
        from gpucluster.infra.pulumi.provider import PulumiProvider
        from gpucluster.infra.registry import plugin

        account = self

        class Driver(PulumiDriver):
            def up(self, spec, events=None):
                account.seen[spec.name] = spec
                return super().up(spec, events)

        clock = self.timed.clock
        driver = Driver(pulumi_command=self.fake, program_runner=lambda s: None)
        driver.sleep = clock.sleep
        return PulumiProvider(plugin("aws"), driver=driver,
                              credentials=lambda region=None: [{"check": "aws credentials", "ok": True,
                                                                "detail": "account"}],
                              cloud_checks=lambda spec: None,
                              scan_options={"clock": clock.now, "sleep": clock.sleep, "poll_seconds": 10,
                                            "await_seconds": 900})


@pytest.fixture
def account(home, monkeypatch):
    yield from accounts(monkeypatch, 20.0)


def accounts(monkeypatch: Any, scale: float, **timed: Any) -> Any:
    """The account fixture's body: a clock of `scale` simulated seconds per real second; `timed`: TimedEc2's
    options (profile_s, ...)."""
    import moto

    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "PULUMI_BACKEND_URL",
                "PULUMI_CONFIG_PASSPHRASE", "PULUMI_CONFIG_PASSPHRASE_FILE", "GPUCLUSTER_STATE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    from gpucluster.infra.aws import outputs

    monkeypatch.setattr(outputs, "RUNNING_POLL_S", 0.25, raising=False)  # real seconds: 5 s on the scaled clock
    with moto.mock_aws():
        model = TimedEc2(ScaledClock(scale), pending_s=(20.0, 40.0), terminate_s=(60.0, 120.0), **timed)
        yield Account(model.install(monkeypatch))


def _spec(name: str = "t40", **kw: Any) -> Any:
    from gpucluster.ownership import installation_id, owner_marks
    from gpucluster.spec import ClusterSpec, new_run_id

    from specs import validate

    kw.setdefault("marks", owner_marks(installation_id()))  # as `up`/`run` mark what they make
    # the default shape: two g5.xlarge nodes in the default region
    spec = ClusterSpec(cloud="aws", nodes=2, name=name, region=REGION, instance_type="g5.xlarge",
                       ssh_cidr="203.0.113.7/32", gpus_per_node=1, run_id=new_run_id(), **kw)
    validate(spec)
    return spec


class _Quiet:
    def __getattr__(self, name: str) -> Any:
        return lambda *a, **kw: None
