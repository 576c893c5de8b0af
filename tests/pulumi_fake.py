"""FAKE Pulumi CLI for tests: a stand-in for `pulumi.automation.PulumiCommand`.

THIS IS A TEST DOUBLE, NOT PULUMI. It records every argv the Automation API would have run
(`calls`), keeps a tiny in-memory model of stacks and their resources, writes engine events to
the `--event-log` target (a file, or the gRPC `tcp://` endpoint newer CLIs use) the way the real
engine does, and returns scripted outputs and failures:

- `fail_up_after=N, fail_text=...`: `up` creates N resources, then fails with that diagnostic, in the
  real CLI's order: the failing resource's diagnostic (the cause) first, the stack's own
  `error: update failed` last, in both the engine events and the printed "Diagnostics:" section
  (pulumi/pulumi pkg/backend/display: diagnostics are grouped per resource and the root stack's
  "update failed" comes after the resources'; issue 25 read this from real runs);
- `fail_in_program=True` (with `fail_up_after=N`): the N resources are created, then the program
  raises (the aws program does when its instant fleet launched fewer nodes than asked), reported on
  the stack as the Python language host does, then `error: update failed`;
- `interrupt_up_after=N`: `up` creates N resources, then raises KeyboardInterrupt (Ctrl-C);
- `locked_by_pid=P`: the stack carries a DIY-backend lock left by pid P until `cancel`;
- `fail_destroy_text=...`: `destroy` fails once with that stderr (resources stay);
- `destroy_in_account=True`: `on_destroy(stack)` is the provider's deletes in the account, run as the
  destroy's own steps; what it raises fails the destroy, the stack keeping its resources;
- `up_in_account=True`: `on_up(stack)` is the provider's creates (and updates) in the account, run as
  the update's own steps; what it raises fails the update, as the engine reports a failed resource or
  a program that raised (the resources made stay in the stack); `replaced` keeps each update's
  `--replace` URNs (`pulumi up --replace`: "Specify resources to replace");
- `before_up(stack)`: called as `up` starts (another user's cluster landing between a check and a create);
- `persist=True`: the stacks live in the `file://` backend named by PULUMI_BACKEND_URL, as a
  self-managed backend keeps them ("State and backends", Pulumi docs: the state is a file per stack
  under `.pulumi/stacks/<project>/` in the backend), so two fakes (two machines) sharing that folder
  see the same stacks; and their secrets work as the passphrase provider's do (pulumi/pulumi
  pkg/secrets/passphrase): `stack init` needs a passphrase (PULUMI_CONFIG_PASSPHRASE or
  PULUMI_CONFIG_PASSPHRASE_FILE, else "passphrase must be set with ..."), the state records its salt
  and a check value made with it, and every command that decrypts the state (up, refresh, destroy,
  stack output) verifies the passphrase against that state, failing with "incorrect passphrase".
  Without it (the old, kinder fake) every machine has its own in-memory stacks.
"""

from __future__ import annotations

import json
import socket
import time
from typing import Any

from pulumi.automation import CommandResult
from pulumi.automation.errors import create_command_error
from semver import VersionInfo

AWS_RESOURCES = [
    ("aws:ec2/vpc:Vpc", "demo-vpc", "vpc-0a1"),
    ("aws:ec2/securityGroup:SecurityGroup", "demo-sg", "sg-0b2"),
    ("aws:ec2/rule:Rule", "demo-in-members", "sgr-1"),  # not recorded (a rule)
    ("aws:ec2/keyPair:KeyPair", "demo-key", "key-0c3"),
    ("aws:ec2/instance:Instance", "demo-node-0", "i-0000000000000000a"),
    ("aws:ec2/instance:Instance", "demo-node-1", "i-0000000000000000b"),
]

# what the aws program declares since issue 25: the nodes come from one launch template through one
# instant EC2 Fleet (infra/aws/component.py); the fleet is one ledger row for its N instances
AWS_FLEET_RESOURCES = [
    ("aws:ec2/vpc:Vpc", "demo-vpc", "vpc-0a1"),
    ("aws:ec2/securityGroup:SecurityGroup", "demo-sg", "sg-0b2"),
    ("aws:ec2/rule:Rule", "demo-in-members", "sgr-1"),  # not recorded (a rule)
    ("aws:ec2/keyPair:KeyPair", "demo-key", "key-0c3"),
    ("aws:ec2/launchTemplate:LaunchTemplate", "demo-nodes", "lt-0d4"),
    ("aws:ec2/fleet:Fleet", "demo-fleet", "fleet-0e5f6a7b8-1234-4c5d-9e0f-0123456789ab"),
]


def aws_outputs(n: int = 2) -> dict[str, Any]:
    return {
        "cluster_name": "demo",
        "instance_ids": [f"i-00000000000000{i:02d}" for i in range(n)],
        "private_ips": [f"10.42.0.{10 + i}" for i in range(n)],
        "public_ips": [f"203.0.113.{10 + i}" for i in range(n)],
        "host_public_keys": [f"ssh-ed25519 AAAAHOST{i}" for i in range(n)],
        "ssh_user": "ubuntu",
        "ssh_private_key": "-----BEGIN OPENSSH PRIVATE KEY-----\nFAKE\n-----END OPENSSH PRIVATE KEY-----",
        "region": "us-east-1",
        "availability_zone": "us-east-1a",
        "instance_type": "g5.xlarge",
        "gpus_per_node": 1,
    }


class FakePulumiCommand:
    """FAKE `PulumiCommand`: records argv, scripts results. Not the Pulumi CLI."""

    command = "pulumi(FAKE)"

    def __init__(self, *, version: str = "3.200.0", resources=None, outputs=None, secret_keys=("ssh_private_key",),
                 fail_up_after: int | None = None, fail_text: str = "", interrupt_up_after: int | None = None,
                 locked_by_pid: int | None = None, fail_destroy_text: str = "", on_up=None, on_destroy=None,
                 fail_up_times: int | None = None, provider_max_retries: int | None = None,
                 before_up=None, persist: bool = False, step_delay_s: float = 0.0, fail_in_program: bool = False,
                 create_delays: dict[str, float] | None = None, destroy_in_account: bool = False,
                 up_in_account: bool = False):
        self.version = VersionInfo.parse(version)
        self.calls: list[list[str]] = []
        self.envs: list[dict[str, str]] = []
        self.stacks: dict[str, list[tuple[str, str, str]]] = {}
        self.outputs: dict[str, dict[str, Any]] = {}
        self.resources = list(AWS_RESOURCES if resources is None else resources)
        self.scripted_outputs = aws_outputs() if outputs is None else outputs
        self.secret_keys = set(secret_keys)
        self.fail_up_after, self.fail_text = fail_up_after, fail_text
        self.fail_in_program = fail_in_program  # the failure is the program's exception, not a resource's
        self.interrupt_up_after = interrupt_up_after
        self.locked_by_pid = locked_by_pid
        self.fail_destroy_text = fail_destroy_text
        self.inputs: dict[str, dict[str, Any]] = {}  # resource name -> engine inputs (camelCase)
        # on_up(stack): called when `up` succeeds, before the outputs are stored (it may change
        # scripted_outputs and start the "instances"); on_destroy(stack): after `destroy`
        self.on_up, self.on_destroy = on_up, on_destroy
        # destroy_in_account: `on_destroy` is the provider's deletes, run before the stack is emptied;
        # an exception from it fails the destroy (the resources stay in the stack)
        self.destroy_in_account = destroy_in_account
        self.up_in_account = up_in_account
        self.replaced: list[list[str]] = []  # each `up`'s --replace URNs
        self.before_up = before_up
        self.persist = persist
        self.salts: dict[str, str] = {}  # stack -> the passphrase provider's "v1:salt:check" (its state)
        self.fail_up_times = fail_up_times  # with fail_up_after: only the first N ups fail
        # seconds each resource step takes: the engine reports a resource's outputs only once the
        # provider has created (or deleted) it, and cloud resources take seconds to minutes (an EC2
        # instance is "pending" before "running": https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/
        # ec2-instance-lifecycle.html); 0: every event at once (the old, kinder fake)
        self.step_delay_s = step_delay_s
        # seconds the create step of a resource (by name, or by type) takes, where it differs from
        # step_delay_s (a GKE cluster takes minutes, its GPU node pool minutes more: tests/gke_fake.py)
        self.create_delays = dict(create_delays or {})
        # The AWS provider retries InsufficientInstanceCapacity on RunInstances before it reports
        # it (terraform-provider-aws internal/service/ec2/service_package.go; issues #43193, #49863).
        # Its `max_retries` (the program's provider setting; default 25) becomes the SDK's
        # MaxAttempts (hashicorp/aws-sdk-go-base aws_config.go: config.WithRetryMaxAttempts), with
        # MaxBackoff 300 s (same file, resolveRetryer). The SDK's attempt loop numbers the first
        # attempt 1 and, after each failed attempt n < MaxAttempts, sleeps RetryDelay(n)
        # (aws-sdk-go-v2 aws/retry/middleware.go), which ExponentialJitterBackoff makes less than
        # 2^n + 1 s (jitter_backoff.go: b*2^n in older releases, b+2^n in newer ones, b in [0,1)),
        # capped at MaxBackoff. With provider_max_retries set, a capacity failure is reported only
        # after the worst case of that delay, on a virtual clock (`now()`) that advances instead of
        # sleeping; None: reported at once (the old, kinder fake).
        self.provider_max_retries = provider_max_retries
        self.clock_offset = 0.0
        self.up_started: list[float] = []  # now() at the start of each `up`
        self.capacity_errors_at: list[float] = []  # now() when EC2 first answered the capacity error

    # -- helpers -------------------------------------------------------------------------------
    def verbs(self) -> list[str]:
        """The command of each call, e.g. 'stack select', 'up', 'destroy'."""
        out = []
        for argv in self.calls:
            words = [a for a in argv if not a.startswith("-")]
            out.append(" ".join(words[:2]) if words and words[0] in ("stack", "plugin", "config") else words[0])
        return out

    def _fail(self, stderr: str, stdout: str = "", code: int = 255):
        raise create_command_error(CommandResult(stdout=stdout, stderr=stderr, code=code))

    @staticmethod
    def _flag(args: list[str], name: str) -> str | None:
        for i, a in enumerate(args):
            if a == name and i + 1 < len(args):
                return args[i + 1]
            if a.startswith(name + "="):
                return a.split("=", 1)[1]
        return None

    def _spend_failure(self) -> None:
        """One failed `up` of the `fail_up_times` asked for: the next ones succeed once they are spent."""
        if self.fail_up_times is not None:
            self.fail_up_times -= 1
            if self.fail_up_times <= 0:
                self.fail_up_after = None

    def _emit(self, target: str | None, events: list[dict[str, Any]]) -> None:
        if not target:
            return
        stamped = [{"sequence": i, "timestamp": int(time.time()), **e} for i, e in enumerate(events)]
        if target.startswith("tcp://"):
            import grpc
            from pulumi.runtime.proto import events_pb2, events_pb2_grpc

            with grpc.insecure_channel(target[len("tcp://"):]) as channel:
                stub = events_pb2_grpc.EventsStub(channel)
                stub.StreamEvents(events_pb2.EventRequest(event=json.dumps(e)) for e in self._paced(stamped))
            return
        with open(target, "a", encoding="utf-8") as fh:
            for e in self._paced(stamped, fh.flush):
                fh.write(json.dumps(e) + "\n")

    def _paced(self, events: list[dict[str, Any]], flush: Any = None) -> Any:
        """The events, each resource's outputs `step_delay_s` (or its type's `create_delays`) after the
        step began."""
        for e in events:
            delay = self.step_delay_s
            meta = (e.get("resOutputsEvent") or {}).get("metadata") or {}
            if meta.get("op") == "create":  # by the resource's name, else by its type
                name = str(meta.get("urn", "")).rsplit("::", 1)[-1]
                delay = self.create_delays.get(name, self.create_delays.get(meta.get("type"), delay))
            if delay and ("resOutputsEvent" in e or "diagnosticEvent" in e):
                if flush is not None:
                    flush()
                time.sleep(delay)
            yield e

    def _step(self, kind: str, op: str, type_: str, name: str, rid: str, stack: str) -> dict[str, Any]:
        urn = f"urn:pulumi:{stack}::gpucluster::{type_}::{name}"
        inputs = self.inputs.get(name, {})
        state = {"type": type_, "urn": urn, "id": rid, "inputs": inputs, "outputs": inputs}
        meta = {"op": op, "urn": urn, "type": type_, "provider": "",
                "old": state if op == "delete" else None, "new": None if op == "delete" else state}
        return {kind: {"metadata": meta}}

    # -- a self-managed file backend (persist=True) ------------------------------------------------
    @staticmethod
    def _store(env: dict) -> Any:
        from pathlib import Path
        from urllib.parse import urlparse

        url = env.get("PULUMI_BACKEND_URL", "")
        if not url.startswith("file://"):
            return None
        return Path(urlparse(url).path) / ".pulumi" / "stacks" / "gpucluster"

    def _load(self, store) -> None:
        self.stacks, self.outputs, self.salts = {}, {}, {}
        if not store.is_dir():
            return
        for f in store.glob("*.json"):
            doc = json.loads(f.read_text())
            latest = doc["checkpoint"]["latest"]
            self.stacks[f.stem] = [tuple(r) for r in latest["resources"]]
            self.salts[f.stem] = latest["secrets_providers"]["state"]["salt"]
            if latest.get("outputs") is not None:
                self.outputs[f.stem] = latest["outputs"]

    def _save(self, store) -> None:
        store.mkdir(parents=True, exist_ok=True)
        for f in store.glob("*.json"):
            if f.stem not in self.stacks:
                f.unlink()
        for name, resources in self.stacks.items():
            latest = {"secrets_providers": {"type": "passphrase", "state": {"salt": self.salts.get(name, "")}},
                      "resources": [list(r) for r in resources], "outputs": self.outputs.get(name)}
            (store / f"{name}.json").write_text(json.dumps({"version": 3, "checkpoint": {"latest": latest}}))

    @staticmethod
    def _passphrase(env: dict) -> str | None:
        if env.get("PULUMI_CONFIG_PASSPHRASE"):
            return env["PULUMI_CONFIG_PASSPHRASE"]
        if env.get("PULUMI_CONFIG_PASSPHRASE_FILE"):
            from pathlib import Path

            return Path(env["PULUMI_CONFIG_PASSPHRASE_FILE"]).read_text().strip()
        return None

    @staticmethod
    def _check_value(phrase: str, salt: str) -> str:
        import hashlib
        import hmac

        return hmac.new(phrase.encode(), salt.encode(), hashlib.sha256).hexdigest()[:16]

    def _secrets(self, stack: str, env: dict, *, new: bool = False) -> None:
        phrase = self._passphrase(env)
        if phrase is None:
            self._fail('error: constructing secrets manager of type "passphrase": passphrase must be set with '
                       "PULUMI_CONFIG_PASSPHRASE or PULUMI_CONFIG_PASSPHRASE_FILE environment variables")
        if new:
            import secrets as _secrets

            salt = _secrets.token_hex(8)
            self.salts[stack] = f"v1:{salt}:{self._check_value(phrase, salt)}"
            return
        _, salt, check = (self.salts.get(stack) or "v1::").split(":", 2)
        if self._check_value(phrase, salt) != check:
            self._fail('error: constructing secrets manager of type "passphrase": incorrect passphrase')

    # -- the PulumiCommand interface -------------------------------------------------------------
    def run(self, args, cwd, additional_env, on_output=None, on_error=None) -> CommandResult:
        import os

        env = {**os.environ, **additional_env}  # the CLI process inherits the caller's environment
        store = self._store(env) if self.persist else None
        if store is None:
            return self._run(args, cwd, additional_env)
        self._load(store)
        try:
            words = [a for a in args if not a.startswith("-")]
            stack = self._flag(args, "--stack")
            if args[:2] == ["stack", "init"]:
                self._secrets(words[2], env, new=True)
            elif (words and words[0] in ("up", "refresh", "destroy")
                  or args[:2] == ["stack", "output"] and "--show-secrets" in args) and stack in self.stacks:
                self._secrets(stack, env)
            return self._run(args, cwd, additional_env)
        finally:
            self._save(store)

    def _run(self, args, cwd, additional_env, on_output=None, on_error=None) -> CommandResult:
        args = [a for a in args if a != "--non-interactive"]
        self.calls.append(list(args))
        self.envs.append(dict(additional_env))
        stack = self._flag(args, "--stack")
        words = [a for a in args if not a.startswith("-")]
        if args[:2] == ["stack", "select"]:
            if stack not in self.stacks:
                self._fail(f"error: no stack named '{stack}' found")
            return CommandResult("", "", 0)
        if args[:2] == ["stack", "init"]:
            self.stacks.setdefault(words[2], [])
            return CommandResult("", "", 0)
        if args[:2] == ["stack", "rm"]:
            self.stacks.pop(words[-1], None)
            self.outputs.pop(words[-1], None)
            return CommandResult("", "", 0)
        if args[:2] == ["stack", "ls"]:
            rows = [{"name": f"organization/gpucluster/{n}", "current": False, "resourceCount": len(r)}
                    for n, r in self.stacks.items()]
            return CommandResult(json.dumps(rows), "", 0)
        if args[:2] == ["stack", "output"]:
            outs = dict(self.outputs.get(stack, {}))
            if "--show-secrets" not in args:
                outs = {k: ("[secret]" if k in self.secret_keys else v) for k, v in outs.items()}
            return CommandResult(json.dumps(outs), "", 0)
        if args[:2] == ["stack", "history"]:
            row = {"kind": "update", "startTime": "2026-11-22T03:00:00.000000Z", "message": "", "environment": {},
                   "config": {}, "result": "succeeded", "endTime": "2026-11-22T03:01:00.000000Z", "version": 1}
            return CommandResult(json.dumps([row]), "", 0)
        if words and words[0] in ("up", "refresh", "destroy") and self.locked_by_pid is not None:
            self._fail("error: the stack is currently locked by 1 lock(s). Either wait for the other process(es) "
                       "to end or delete the lock file with `pulumi cancel`.\n  file:///x/.pulumi/locks/organization/"
                       f"gpucluster/{stack}/abc.json: created by me@{socket.gethostname()} (pid {self.locked_by_pid}) "
                       "at 2026-11-22T03:00:00Z")
        if words and words[0] == "cancel":
            self.locked_by_pid = None
            return CommandResult("", "", 0)
        if words and words[0] == "up":
            return self._up(args, stack)
        if words and words[0] == "refresh":
            self._emit(self._flag(args, "--event-log"), [{"cancelEvent": {}}])
            return CommandResult("Refreshing (FAKE)", "", 0)
        if words and words[0] == "destroy":
            return self._destroy(args, stack)
        if words and words[0] == "version":
            return CommandResult(f"v{self.version}", "", 0)
        if args[:2] == ["plugin", "ls"]:
            return CommandResult(json.dumps([{"name": "aws", "kind": "resource", "version": "7.0.0"}]), "", 0)
        self._fail(f"FAKE pulumi: unscripted command {args}")

    def now(self) -> float:
        return time.monotonic() + self.clock_offset

    SDK_MAX_BACKOFF_S = 300.0  # aws-sdk-go-base resolveRetryer: so.MaxBackoff = 300 s

    @classmethod
    def provider_retry_delay(cls, max_retries: int) -> float:
        """Worst-case backoff before the provider reports a retryable error it got on every attempt:
        `max_retries` attempts, so max_retries - 1 sleeps, RetryDelay(1) .. RetryDelay(n - 1)."""
        return float(sum(min(2.0 ** n + 1, cls.SDK_MAX_BACKOFF_S) for n in range(1, max_retries)))

    def _up(self, args, stack):
        self.up_started.append(self.now())
        if self.before_up is not None:
            self.before_up(stack)
        target = self._flag(args, "--event-log")
        made = self.stacks.setdefault(stack, [])
        limit = len(self.resources)
        for cutoff in (self.fail_up_after, self.interrupt_up_after):
            if cutoff is not None:
                limit = min(limit, cutoff)
        events: list[dict[str, Any]] = [{"preludeEvent": {"config": {}}}]
        for type_, name, rid in self.resources[:limit]:
            events.append(self._step("resourcePreEvent", "create", type_, name, rid, stack))
            events.append(self._step("resOutputsEvent", "create", type_, name, rid, stack))
            made.append((type_, name, rid))
        if self.fail_up_after is not None and self.fail_in_program:
            # the program itself raised (in an apply, after the resources it read were created): the
            # Python language host reports it on the stack, "Program failed with an unhandled
            # exception:" and the traceback (pulumi/pulumi sdk/python/cmd/pulumi-language-python-exec),
            # then the stack's "update failed"; no resource step fails
            stack_urn = f"urn:pulumi:{stack}::gpucluster::pulumi:pulumi:Stack::gpucluster-{stack}"
            trace = ("Program failed with an unhandled exception:\nTraceback (most recent call last):\n"
                     '  File "/work/infra/aws/engine.py", line 170, in fleet_instance_ids\n'
                     f"gpucluster.errors.ProvisionError: {self.fail_text}\n")
            events.append({"diagnosticEvent": {"message": trace, "color": "never", "severity": "error",
                                               "urn": stack_urn}})
            events.append({"diagnosticEvent": {"message": "update failed\n", "color": "never", "severity": "error",
                                               "urn": stack_urn}})
            events.append({"cancelEvent": {}})
            self._emit(target, events)
            self._spend_failure()
            shown = "".join(f"    {'error: ' if i == 0 else ''}{ln}\n" for i, ln in enumerate(trace.splitlines()))
            self._fail("", stdout=(f"Updating ({stack}):\n\nDiagnostics:\n  pulumi:pulumi:Stack (gpucluster-{stack}):\n"
                                   f"{shown}    error: update failed\n\nResources:\n    + {limit} created\n\n"
                                   "Duration: 1s\n"))
        if self.fail_up_after is not None:
            type_, name, rid = self.resources[limit]
            if self.provider_max_retries is not None and "InsufficientInstanceCapacity" in self.fail_text:
                self.capacity_errors_at.append(self.now())
                self.clock_offset += self.provider_retry_delay(self.provider_max_retries)
            cause = self.fail_text[len("error: "):] if self.fail_text.startswith("error: ") else self.fail_text
            stack_urn = f"urn:pulumi:{stack}::gpucluster::pulumi:pulumi:Stack::gpucluster-{stack}"
            # the real engine's order: the resource's diagnostic (the cause), its failed step, and
            # only then the stack's own "update failed" diagnostic (see the module docstring)
            events.append(self._step("resourcePreEvent", "create", type_, name, rid, stack))
            events.append({"diagnosticEvent": {"message": cause + "\n", "color": "never", "severity": "error",
                                               "urn": f"urn:pulumi:{stack}::gpucluster::{type_}::{name}"}})
            events.append(self._step("resOpFailedEvent", "create", type_, name, rid, stack))
            events.append({"diagnosticEvent": {"message": "update failed\n", "color": "never", "severity": "error",
                                               "urn": stack_urn}})
            events.append({"cancelEvent": {}})
            self._emit(target, events)
            self._spend_failure()
            kind = type_.split("/")[0] + ":" + type_.rsplit(":", 1)[-1]  # aws:ec2/instance:Instance -> aws:ec2:Instance
            stdout = (f"Updating ({stack}):\n\nDiagnostics:\n  {kind} ({name}):\n    error: {cause}\n\n"
                      f"  pulumi:pulumi:Stack (gpucluster-{stack}):\n    error: update failed\n\n"
                      f"Resources:\n    + {limit} created\n\nDuration: 1s\n")
            self._fail("", stdout=stdout)
        if self.interrupt_up_after is not None:
            self._emit(target, events + [{"cancelEvent": {}}])
            raise KeyboardInterrupt()
        self.replaced.append([args[n + 1] for n, a in enumerate(args[:-1]) if a == "--replace"])
        if self.on_up is not None and self.up_in_account:
            try:
                self.on_up(stack)
            except Exception as exc:  # noqa: BLE001 - the provider's or the program's error, as the CLI prints it
                self._fail_in_account(target, events, stack, exc, "Updating")
        self._emit(target, events + [{"cancelEvent": {}}])
        if self.on_up is not None and not self.up_in_account:
            self.on_up(stack)
        self.outputs[stack] = dict(self.scripted_outputs)
        return CommandResult("Updating (FAKE)\nResources: created", "", 0)

    def _fail_in_account(self, target, events, stack, exc, doing):
        """An error raised by the account's creates or deletes, as the engine reports a failed resource:
        each line a diagnostic of the stack, then "update failed", in the events and the printed text."""
        stack_urn = f"urn:pulumi:{stack}::gpucluster::pulumi:pulumi:Stack::gpucluster-{stack}"
        lines = str(exc).splitlines() or [type(exc).__name__]
        diags = [{"diagnosticEvent": {"message": ln + "\n", "color": "never", "severity": "error",
                                      "urn": stack_urn}} for ln in [*lines, "update failed"]]
        self._emit(target, events + diags + [{"cancelEvent": {}}])
        shown = "".join(f"    error: {ln}\n" for ln in lines)
        self._fail("", stdout=(f"{doing} ({stack}):\n\nDiagnostics:\n  pulumi:pulumi:Stack (gpucluster-{stack}):\n"
                               f"{shown}    error: update failed\n\nDuration: 1s\n"))

    def _destroy(self, args, stack):
        target = self._flag(args, "--event-log")
        if self.fail_destroy_text:
            text, self.fail_destroy_text = self.fail_destroy_text, ""
            self._emit(target, [{"cancelEvent": {}}])
            self._fail(f"error: destroy failed\n{text}")
        if self.on_destroy is not None and self.destroy_in_account:
            # the provider's deletes in the account (tests/aws_apply.py destroy_as_provider): a delete
            # that fails fails the destroy, as the engine reports it (each failed resource's diagnostic,
            # then the stack's "update failed"), and the stack keeps its resources for the next destroy
            try:
                self.on_destroy(stack)
            except Exception as exc:  # noqa: BLE001 - the provider's error, as the CLI prints it
                self._fail_in_account(target, [], stack, exc, "Destroying")
        events = []
        for type_, name, rid in reversed(self.stacks.get(stack, [])):
            events.append(self._step("resourcePreEvent", "delete", type_, name, rid, stack))
            events.append(self._step("resOutputsEvent", "delete", type_, name, rid, stack))
        self._emit(target, events + [{"cancelEvent": {}}])
        self.stacks[stack] = []
        self.outputs.pop(stack, None)
        if self.on_destroy is not None and not self.destroy_in_account:
            self.on_destroy(stack)
        return CommandResult("Destroying (FAKE)", "", 0)
