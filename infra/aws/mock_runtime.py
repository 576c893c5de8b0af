"""Run the Pulumi program offline under Pulumi's mock runtime and record what it declares.

Used by tests/test_aws*.py and benchmarks/aws_program.py. Nothing here talks to AWS: resource
registrations and provider calls (`aws:ec2/getAmi:getAmi`, ...) are answered by `Recorder`, which
keeps every request so tests can assert on the exact inputs the program sends to the engine.
Inputs are recorded as the engine sees them: camelCase names, secrets wrapped in
`{SECRET_SIG: ..., "value": ...}`.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import pulumi

from gpucluster.errors import GpuclusterError
from gpucluster.spec import ClusterSpec
from gpucluster.states import JsonObject

Monitor = Any  # Any: pulumi's resource monitor is a gRPC stub, generated code without types
GrpcMessage = Any  # Any: the monitor's protobuf requests and answers (generated code without types)

SECRET_SIG = "4dabf18193072939515e22adb298388d"  # the engine's marker for a secret value

MOCK_AMI_ID = "ami-0mockdlami0000001"
# the mock DLAMI's root snapshot: about 75 GB like the real GPU DLAMIs' (infra/aws/rootdisk.py); tests change it
MOCK_AMI_SNAPSHOT_GB = 75
MOCK_ZONES = ("us-east-1d", "us-east-1a", "us-east-1b")  # unsorted on purpose
MOCK_EXISTING_SUBNET = {"id": "subnet-0existing", "vpcId": "vpc-0existing", "availabilityZone": "us-east-1c"}


def rank_of(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def instance_id(rank: int) -> str:
    """The mock fleet's instances: ids that sort in rank order (the program ranks them by id)."""
    return f"i-0mock{rank:012d}"


def rank_of_instance(instance_id_: str) -> int:
    return int(instance_id_.rsplit("mock", 1)[1])


def private_ip(rank: int) -> str:
    return f"10.42.{rank // 200}.{10 + rank % 200}"


def public_ip(rank: int) -> str:
    return f"198.51.{100 + rank // 200}.{10 + rank % 200}"


class Recorder(pulumi.runtime.Mocks):
    """Answers the engine like a tiny fake AWS and remembers every request."""

    def __init__(self, fleet_launches: int | None = None, fleet_error: str = "") -> None:
        self.fleet_error = fleet_error  # what DescribeFleets' `Errors` would say of a short fleet
        self.resources: list[pulumi.runtime.MockResourceArgs] = []
        self.calls: list[pulumi.runtime.MockCallArgs] = []
        self.fleet_launches = fleet_launches  # None: a fleet launches its whole target
        # resource name -> the options the engine would act on in an update: {"replaceOnChanges": [...],
        # "deleteBeforeReplace": bool} (what a `pulumi up` of a changed program replaces, and how)
        self.options: dict[str, JsonObject] = {}

    def watch(self, monitor: Monitor) -> None:
        """Keep each registration's replacement options (the mock runtime passes only inputs on)."""
        register = monitor.RegisterResource

        def recording(request: GrpcMessage) -> GrpcMessage:
            self.options[request.name] = {"replaceOnChanges": list(request.replaceOnChanges),
                                          "deleteBeforeReplace": bool(request.deleteBeforeReplace)}
            return register(request)

        monitor.RegisterResource = recording

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(args)
        state = dict(args.inputs)
        state.setdefault("name", args.name)
        if args.typ == "aws:ec2/instance:Instance":
            rank = rank_of(args.name)
            state.update(privateIp=private_ip(rank), publicIp=public_ip(rank))
        elif args.typ == "aws:ec2/fleet:Fleet":
            # an instant fleet reports what it launched (`fleet_instance_sets`); the mock launches
            # the whole target unless told to launch fewer (a capacity shortage: `fleet_launches`)
            target = int((args.inputs.get("targetCapacitySpecification") or {}).get("totalTargetCapacity") or 0)
            n = target if self.fleet_launches is None else self.fleet_launches
            state.update(fleetInstanceSets=[{"instanceIds": [instance_id(i) for i in range(n)],
                                             "instanceType": ((args.inputs.get("launchTemplateConfigs") or [{}])[0].get(
                                                 "overrides") or [{}])[0].get("instanceType")}] if n else [])
        elif args.typ == "aws:ec2/launchTemplate:LaunchTemplate":
            state.setdefault("latestVersion", 1)
        elif args.typ == "aws:ec2/eip:Eip":
            state.update(publicIp="203.0.113." + str(10 + rank_of(args.name)), allocationId=f"eipalloc-mock{rank_of(args.name)}",
                         associationId=f"eipassoc-mock{rank_of(args.name)}" if args.inputs.get("networkInterface") else "")
        elif args.typ == "aws:ec2/keyPair:KeyPair":
            state.setdefault("keyName", args.name)
        elif args.typ == "tls:index/privateKey:PrivateKey":
            state.update(
                privateKeyOpenssh=(
                    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
                    f"mock-{args.name}\n-----END OPENSSH PRIVATE KEY-----\n"
                ),
                publicKeyOpenssh=f"ssh-ed25519 AAAAmock{args.name.replace('-', '')}\n",
            )
        return [f"{args.name}-id", state]

    def call(self, args: pulumi.runtime.MockCallArgs):
        self.calls.append(args)
        if args.token == "aws:ec2/getAmi:getAmi":
            return {"id": MOCK_AMI_ID, "name": "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.7 (Ubuntu 22.04) 20261120",
                    "rootDeviceName": "/dev/sda1", "blockDeviceMappings": [{"deviceName": "/dev/sda1", "ebs": {
                        "snapshot_id": "snap-0mockdlami00001", "volume_size": str(MOCK_AMI_SNAPSHOT_GB),
                        "volume_type": "gp3"}}]}
        if args.token == "aws:ec2/getInstance:getInstance":
            rank = rank_of_instance(args.args["instanceId"])
            return {"id": args.args["instanceId"], "instanceId": args.args["instanceId"],
                    "privateIp": private_ip(rank), "publicIp": public_ip(rank), "networkInterfaceId": f"eni-mock{rank}"}
        if args.token == "aws:ec2/getInstanceTypeOfferings:getInstanceTypeOfferings":
            n = len(MOCK_ZONES)
            return {
                "id": "offerings",
                "locations": list(MOCK_ZONES),
                "locationTypes": ["availability-zone"] * n,
                "instanceTypes": [args.args["filters"][0]["values"][0]] * n,
            }
        if args.token == "aws:ec2/getSubnet:getSubnet":
            return dict(MOCK_EXISTING_SUBNET, id=args.args.get("id", MOCK_EXISTING_SUBNET["id"]))
        return {}

    # -- queries used by the tests -------------------------------------------------------------
    def of_type(self, typ: str) -> list[pulumi.runtime.MockResourceArgs]:
        return [r for r in self.resources if r.typ == typ]

    def instances(self) -> list[pulumi.runtime.MockResourceArgs]:
        return sorted(self.of_type("aws:ec2/instance:Instance"), key=lambda r: rank_of(r.name))

    def fleet(self) -> pulumi.runtime.MockResourceArgs | None:
        found = self.of_type("aws:ec2/fleet:Fleet")
        return found[0] if found else None

    def node_template(self) -> pulumi.runtime.MockResourceArgs | None:
        """The launch template the fleet launches from."""
        found = [r for r in self.of_type("aws:ec2/launchTemplate:LaunchTemplate") if r.name.endswith("-nodes")]
        return found[0] if found else None

    def calls_to(self, token: str) -> list[pulumi.runtime.MockCallArgs]:
        return [c for c in self.calls if c.token == token]


@dataclass
class Built:
    recorder: Recorder
    outputs: JsonObject = field(default_factory=dict)  # each output's resolved value
    secret: dict[str, bool] = field(default_factory=dict)
    error: GpuclusterError | None = None
    seconds: float = 0.0


def build(
    spec: ClusterSpec | None = None,
    *,
    program: Callable[[], Mapping[str, pulumi.Output[object]] | None] | None = None,
    stack: str = "test",
    fleet_launches: int | None = None,
    fleet_error: str = "",
) -> Built:
    """Run `infra.program.run(spec)` (or `program()`) under mocks; wait for every registration.

    A GpuclusterError raised by the program is caught and returned in `Built.error`, after the
    runtime has drained, so `recorder.resources` shows whether anything was declared first.
    """
    from gpucluster.infra import program as program_module

    declare: Callable[[], Mapping[str, pulumi.Output[object]] | None]
    if program is not None:
        declare = program
    elif spec is not None:
        declare = functools.partial(program_module.run, spec)
    else:
        raise ValueError("build needs a spec or a program")
    from gpucluster.infra.aws import engine

    recorder = Recorder(fleet_launches, fleet_error)
    pulumi.runtime.set_mocks(recorder, project="gpucluster", stack=stack, preview=False)
    recorder.watch(pulumi.runtime.settings.get_monitor())
    built = Built(recorder)

    @pulumi.runtime.test
    def go():
        try:
            outputs = declare()
        except GpuclusterError as exc:
            built.error = exc
            return None

        async def collect():
            for key, out in (outputs or {}).items():
                try:
                    built.outputs[key] = await out.future()
                except GpuclusterError as exc:  # raised inside an apply (a fleet short of its target)
                    built.error = built.error or exc
                    continue
                built.secret[key] = await out.is_secret()

        return collect()

    start = time.perf_counter()
    engine.FLEET_ERRORS[0] = lambda region, fleet_id: recorder.fleet_error
    try:
        go()
    except GpuclusterError as exc:  # raised in an apply, re-raised as the runtime drains
        built.error = built.error or exc
    finally:
        engine.FLEET_ERRORS[0] = engine.fleet_errors
    built.seconds = time.perf_counter() - start
    return built


def unwrap(value: Any) -> Any:
    """A recorded input without its secret wrapper."""
    if isinstance(value, dict) and SECRET_SIG in value:
        return value["value"]
    return value


def is_secret_input(value: object) -> bool:
    return isinstance(value, dict) and SECRET_SIG in value
