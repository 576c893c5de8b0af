"""A failed `pulumi up` on aws is reported by its AWS cause (code and message), not by the stack's
`error: update failed` that the real CLI prints last (infra/aws/failures.py).

The fake Pulumi command (tests/pulumi_fake.py) prints its diagnostics in the real CLI's order: the
resource's error first, the stack's `error: update failed` last (issue 25). The AWS error texts
are in the formats terraform-provider-aws (bridged by pulumi-aws) produces:
- AWS SDK for Go v2: "operation error EC2: RunInstances, https response error StatusCode: 400,
  RequestID: ..., api error CODE: MESSAGE" (aws-sdk-go-v2, smithy-go OperationError/ResponseError;
  seen verbatim in hashicorp/terraform-provider-aws issues, e.g. #43193);
- AWS SDK for Go v1: "CODE: MESSAGE\n\tstatus code: 400, request id: ...".
The VcpuLimitExceeded message is EC2's (https://repost.aws/knowledge-center/ec2-on-demand-instance-vcpu-increase).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))
pytest.importorskip("pulumi.automation")

from pulumi_fake import FakePulumiCommand  # noqa: E402
from test_automation import Recorder, provider, spec  # noqa: E402

from gpucluster.errors import ProvisionError  # noqa: E402
from gpucluster.infra.pulumi import events as pulumi_events  # noqa: E402
from gpucluster.infra.aws.failures import aws_error, classify  # noqa: E402
from gpucluster.infra.registry import plugin as _plugin  # noqa: E402

VCPU = ("creating EC2 Instance: operation error EC2: RunInstances, https response error StatusCode: 400, "
        "RequestID: 5f0a1c7e-0000-4000-8000-000000000000, api error VcpuLimitExceeded: You have requested more vCPU "
        "capacity than your current vCPU limit of 0 allows for the instance bucket that the specified instance type "
        "belongs to. Please visit http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this limit.")
V1 = ("creating IAM Role (demo-role): AccessDenied: User: arn:aws:iam::123456789012:user/dev is not authorized to "
      "perform: iam:CreateRole on resource: arn:aws:iam::123456789012:role/demo-role\n\tstatus code: 403, "
      "request id: 7b1e0000-0000-4000-8000-000000000000")


def test_the_fake_prints_the_cause_first_and_update_failed_last_like_the_real_cli(home):
    fake = FakePulumiCommand(fail_up_after=4, fail_text=VCPU)
    seen = []
    real = pulumi_events.EventBridge.__call__
    pulumi_events.EventBridge.__call__ = lambda self, ev: (seen.append(ev), real(self, ev))[1]
    try:
        with pytest.raises(ProvisionError):
            provider(fake).up(spec(), Recorder())
    finally:
        pulumi_events.EventBridge.__call__ = real
    diags = [ev.diagnostic_event.message.strip() for ev in seen if ev.diagnostic_event is not None]
    assert diags == [VCPU, "update failed"]
    # ... so the generic "last line with error:" of what the CLI printed is the stack's summary:
    # a parser that trusts it reports "update failed" (what the old, cause-last fake hid)
    from pulumi.automation.errors import CommandError

    try:
        fake.fail_up_after = 4
        fake.run(["up", "--stack", "x"], ".", {})
    except CommandError as exc:
        lines = [ln.strip() for ln in pulumi_events.command_text(exc).splitlines() if "error:" in ln]
        assert lines[-1] == "error: update failed" and lines[0].startswith("error: creating EC2 Instance")


def test_a_failed_up_names_the_aws_error_code_and_message_and_the_fix(home):
    fake = FakePulumiCommand(fail_up_after=4, fail_text=VCPU)
    with pytest.raises(ProvisionError) as err:
        provider(fake).up(spec(), Recorder())
    msg = err.value.message
    assert msg.startswith("creating cluster 'demo' failed: VcpuLimitExceeded: You have requested more vCPU capacity")
    assert "update failed" not in msg and "RequestID" not in msg and "\n" not in msg
    assert "--quota-code L-DB2E81BA" in err.value.hint
    assert "has been destroyed" in msg and fake.stacks == {}


def test_the_ledger_keeps_the_aws_cause(home, monkeypatch):
    from gpucluster.cli import common, up
    from gpucluster.ledger.store import Ledger

    fake = FakePulumiCommand(fail_up_after=1, fail_text=V1)
    monkeypatch.setattr(common, "provider_for", lambda cloud, **scope: provider(fake).scoped(**scope))
    with pytest.raises(ProvisionError, match="AccessDenied: User: arn:aws:iam::123456789012:user/dev is not "
                                             "authorized to perform: iam:CreateRole"):
        up.up.main(["--cloud", "aws", "--name", "demo", "--ssh-cidr", "203.0.113.7/32", "--yes"],
                   standalone_mode=False)
    run = Ledger.open_default().list_runs()[0]
    assert run.status == "failed" and "AccessDenied" in run.failure and "iam:CreateRole" in run.failure
    assert "update failed" not in run.failure and "request id" not in run.failure


def test_error_texts_of_both_sdks_and_summary_lines():
    assert aws_error(VCPU)[0] == "VcpuLimitExceeded"
    assert aws_error(V1) == ("AccessDenied", "User: arn:aws:iam::123456789012:user/dev is not authorized to perform: "
                                             "iam:CreateRole on resource: arn:aws:iam::123456789012:role/demo-role")
    assert classify(spec(), "error: update failed\nsomething odd happened") is None
    assert pulumi_events.last_error_line("error: boom in the provider\nerror: update failed") == \
        "error: boom in the provider"
    assert pulumi_events.last_error_line("error: update failed") == "error: update failed"


# -- capacity: a message that names no zone ----------------------------------------------------------
# EC2's capacity message for a cluster placement group names no zone ("We currently do not have
# sufficient g5.xlarge capacity in the Availability Zone you requested" is the zonal form; the
# placement-group form, e.g. "Insufficient capacity.", names none: hashicorp/terraform-provider-aws#43193).
NO_ZONE = ("creating EC2 Instance: operation error EC2: RunInstances, https response error StatusCode: 500, "
           "RequestID: 0a0a0a0a-0000-4000-8000-000000000000, api error InsufficientInstanceCapacity: "
           "Insufficient capacity.")


def test_a_capacity_message_without_a_zone_never_retries_the_failed_zone_first(home):
    from gpucluster.infra.pulumi.engine import PulumiDriver
    from gpucluster.infra.pulumi.provider import PulumiProvider

    fake = FakePulumiCommand(fail_up_after=4, fail_text=NO_ZONE, fail_up_times=1)
    # the zones offering the type, sorted as engine.zones_offering returns them; the program launched
    # in the first by name (us-east-1a) because the spec named none
    lister = lambda region, itype: ["us-east-1a", "us-east-1b", "us-east-1c"]  # noqa: E731
    prov = PulumiProvider(_plugin("aws"), driver=PulumiDriver(pulumi_command=fake, program_runner=lambda s: None,
                                                     zone_lister=lister),
                          find=lambda cloud, name=None, run_id=None, **kw: [], delete=lambda items: [],
                          capacity_attempts=3)
    zones = []
    real_up = prov.driver.up
    prov.driver.up = lambda s, ev=None: zones.append(s.zone) or real_up(s, ev)
    rec = Recorder()
    prov.up(spec(zone=None), rec)
    assert zones == [None, "us-east-1b"]  # not us-east-1a again, and not "?"
    assert any("no capacity for g5.xlarge in us-east-1a" in e[1] for e in rec.log if e[0] == "message")


def test_capacity_error_to_the_next_zones_attempt_is_under_60_s_with_the_providers_retries(home):
    """Measured on the fake's virtual clock: the provider's own retries of InsufficientInstanceCapacity
    (the program's `max_retries`, read from the real program under mocks) + our destroy, scan and
    retry, from EC2's first capacity answer to the next zone's `up`."""
    pytest.importorskip("pulumi_aws")
    from test_automation import CAPACITY

    from gpucluster.infra.aws.mock_runtime import build

    built = build(spec())
    (prov_res,) = [r for r in built.recorder.resources if r.typ == "pulumi:providers:aws"]
    max_retries = int(prov_res.inputs.get("maxRetries", 25))  # 25: the provider's default when unset
    fake = FakePulumiCommand(fail_up_after=4, fail_text=CAPACITY, fail_up_times=1, provider_max_retries=max_retries)
    prov = provider(fake, capacity_attempts=3)
    prov.up(spec(), Recorder())
    assert len(fake.up_started) == 2 and len(fake.capacity_errors_at) == 1
    waited = fake.up_started[1] - fake.capacity_errors_at[0]
    print(f"capacity error -> next zone's attempt: {waited:.1f} s (provider max_retries={max_retries})")
    assert waited <= 60, f"{waited:.0f} s from the capacity error to the next zone's attempt"
    assert waited >= FakePulumiCommand.provider_retry_delay(max_retries) == 2 + 1 + 4 + 1 + 8 + 1


def test_the_fakes_retry_model_is_the_sdks():
    """max_retries is MaxAttempts (aws-sdk-go-base), the first attempt is number 1 and sleeps
    RetryDelay(n) < 2^n + 1 s after each failed attempt n, capped at 300 s (aws-sdk-go-v2 retry
    middleware and ExponentialJitterBackoff; aws-sdk-go-base MaxBackoff). With the provider's default
    of 25 that is about 89 minutes, the "tens of minutes" of hashicorp/terraform-provider-aws#43193.
    The old model (max_retries retries from 2^0, capped at 20 s) said 431 s, and 15 s for 4."""
    delay = FakePulumiCommand.provider_retry_delay
    assert delay(1) == 0  # one attempt: no retry, no wait
    assert delay(4) == 17.0
    assert delay(25) == sum(2 ** n + 1 for n in range(1, 9)) + 16 * 300 == 5318.0
    assert delay(25) > 3600


def test_a_vcpu_limit_is_a_quota_cause_and_other_codes_are_none():
    """EC2's vCPU limits are a quota too low in the region (`ProvisionError.cause` "quota": placement fails over);
    a permission refused is not one (no failover: another place would refuse it too)."""
    assert classify(spec(), VCPU).cause == "quota"
    assert classify(spec(), V1).cause is None
