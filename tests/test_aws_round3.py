"""Issue 40, AWS round 3: the state bucket's region (item 9), temporary credentials (item 8), the
permission simulator's request context (item 7) and buckets encrypted with a KMS key (item 12).

Unit tier: moto's S3/IAM/KMS in this process, and stand-ins of botocore credentials and of IAM's
policy simulator; no subprocess.
"""

from __future__ import annotations

import pytest

pytest.importorskip("moto")

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


@pytest.fixture
def aws(home, monkeypatch):
    import moto

    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "PULUMI_BACKEND_URL", "GPUCLUSTER_STATE",
                "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    from gpucluster.infra.pulumi import state

    monkeypatch.setattr(state, "_BUCKET_REGIONS", {})
    with moto.mock_aws():
        yield


# -- item 9: `--state s3://bucket` without ?region= ------------------------------------------------
def test_a_state_bucket_without_a_region_gets_its_own(aws, monkeypatch):
    """Pulumi's S3 backend needs the bucket's region (MissingRegion with none in the environment, a
    redirect when the bucket is elsewhere): it is read with HeadBucket (x-amz-bucket-region) and put in
    the URL Pulumi gets (old code: the URL as given)."""
    import boto3

    from gpucluster.infra.pulumi import cli, state

    boto3.client("s3", region_name="eu-west-1").create_bucket(
        Bucket="team-state", CreateBucketConfiguration={"LocationConstraint": "eu-west-1"})
    monkeypatch.setenv("GPUCLUSTER_STATE", "s3://team-state/gpucluster")
    state.check_state_region()
    assert cli.backend_url() == "s3://team-state/gpucluster?region=eu-west-1"
    assert cli.workspace_env()["PULUMI_BACKEND_URL"] == "s3://team-state/gpucluster?region=eu-west-1"


def test_a_state_url_that_names_its_region_is_not_looked_up(aws, monkeypatch):
    from gpucluster.infra.pulumi import state

    monkeypatch.setenv("GPUCLUSTER_STATE", "s3://elsewhere?region=us-west-2")
    state.check_state_region(client=object())  # a client it would fail to use: not asked
    assert state.state_url() == "s3://elsewhere?region=us-west-2"


def test_a_state_bucket_whose_region_cannot_be_found_is_refused_with_the_fix(aws, monkeypatch):
    from gpucluster.errors import UsageError
    from gpucluster.infra.pulumi import state

    monkeypatch.setenv("GPUCLUSTER_STATE", "s3://no-such-bucket/x")
    with pytest.raises(UsageError, match=r"names no region .*no bucket 'no-such-bucket'.*nothing was created: "
                                         r"name it in the URL, e.g. s3://no-such-bucket\?region="):
        state.check_state_region()


# -- item 8: temporary credentials against the run's length -----------------------------------------
def _spec(**kw):
    from gpucluster.spec import ClusterSpec

    kw.setdefault("region", "us-east-1")
    return ClusterSpec(cloud="aws", nodes=2, name="cred40", instance_type="g5.xlarge", ssh_cidr="203.0.113.7/32",
                       gpus_per_node=1, **kw)


def test_environment_credentials_that_end_before_the_run_stop_it_before_anything(aws, monkeypatch):
    """Keys exported with AWS_SESSION_TOKEN and AWS_CREDENTIAL_EXPIRATION (what `aws configure
    export-credentials` and SSO tooling write): botocore reads their end (its EnvProvider) but cannot
    refresh them, so 50 minutes left for a run that may last 60 + 15 is refused up front, exit 2, with
    what to do (old code: the run started, and its teardown failed when they ended)."""
    import datetime as dt

    import boto3

    from gpucluster.infra.aws.preflight import PreflightError, preflight

    end = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=50)
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token")
    monkeypatch.setenv("AWS_CREDENTIAL_EXPIRATION", end.strftime("%Y-%m-%dT%H:%M:%SZ"))
    with pytest.raises(PreflightError, match=r"credentials \(env\) end in (49|50) min and cannot be refreshed.*60 min "
                                             r"plus 15.*fix: use a profile that refreshes itself"):
        preflight(_spec(max_lifetime_minutes=60), session=boto3.session.Session())
    from gpucluster.infra.aws.credentials import lifetime_check

    enough = lifetime_check(boto3.session.Session().get_credentials(), _spec(max_lifetime_minutes=30))
    assert enough["ok"] is True and "enough" in enough["detail"]


def test_credentials_botocore_refreshes_pass_and_long_lived_keys_say_nothing():
    import datetime as dt

    from botocore.credentials import Credentials, RefreshableCredentials

    from gpucluster.infra.aws.credentials import lifetime_check

    now = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.timezone.utc)
    role = RefreshableCredentials("A", "S", "T", now + dt.timedelta(minutes=20), refresh_using=lambda: {},
                                  method="assume-role")
    row = lifetime_check(role, _spec(max_lifetime_minutes=240), now=now)
    assert row["ok"] is True and "assumes again" in row["detail"]
    assert lifetime_check(Credentials("A", "S"), _spec(), now=now) is None
    unknown = lifetime_check(Credentials("A", "S", "T", method="shared-credentials-file"), _spec(), now=now)
    assert unknown["ok"] is None and "end is not known" in unknown["detail"]


# -- item 7: the simulator's request context ---------------------------------------------------------
class ScpSimulator:
    """IAM's policy simulator (SimulatePrincipalPolicy) for a caller allowed everything by its identity
    policy, under two Organizations SCPs (Control Tower's region deny and a require-IMDSv2 deny, both
    written with negated operators) and an identity policy that allows ec2:CreateTags only with a tag the
    simulation is not given. As the simulator evaluates them (IAM User Guide, "Condition operators": a
    negated operator such as StringNotEquals matches when the key is absent; "IAM policy simulator": a
    condition on a key the request does not supply leaves it out, listed in MissingContextValues)."""

    REGIONS = ("us-east-1", "us-west-2")

    def simulate_principal_policy(self, **kw):
        ctx = {e["ContextKeyName"]: e["ContextKeyValues"] for e in kw.get("ContextEntries") or []}
        out = []
        for action in kw["ActionNames"]:
            decision, missing = "allowed", []
            if not action.startswith("iam:") and not set(ctx.get("aws:RequestedRegion", [])) & set(self.REGIONS):
                decision = "explicitDeny"  # StringNotEquals aws:RequestedRegion: a missing key matches
            elif action == "ec2:RunInstances" and ctx.get("ec2:MetadataHttpTokens") != ["required"]:
                decision = "explicitDeny"  # StringNotEquals ec2:MetadataHttpTokens "required"
            elif action == "ec2:CreateTags":
                decision, missing = "implicitDeny", ["aws:RequestTag/team"]  # allowed only with that tag
            out.append({"EvalActionName": action, "EvalDecision": decision, "MissingContextValues": missing})
        return {"EvaluationResults": out, "IsTruncated": False}


def test_conditional_scps_pass_with_the_request_context_and_a_missing_key_is_unverified():
    """Item 7: with the region, IMDSv2 and the other keys the real calls carry, the SCPs allow the run;
    an action allowed only under a condition on a key not given is "not verified" (a note), not a
    refusal (old code: no context, so both SCPs matched and the run was refused, exit 2)."""
    from gpucluster.infra.aws import permissions

    caller = "arn:aws:iam::123456789012:user/scp"
    row = permissions.check(ScpSimulator(), _spec(), caller, "123456789012")
    assert row["ok"] is None, row
    assert "ec2:CreateTags (aws:RequestTag/team)" in row["detail"] and "not verified" in row["detail"]
    keys = {e["ContextKeyName"]: e["ContextKeyValues"] for e in permissions.request_context(_spec())}
    assert keys["aws:RequestedRegion"] == ["us-east-1"] and keys["ec2:MetadataHttpTokens"] == ["required"]
    elsewhere = permissions.check(ScpSimulator(), _spec(region="eu-central-1"), caller, "123456789012")
    assert elsewhere["ok"] is False and "ec2:RunInstances" in elsewhere["detail"]  # the region deny still refuses
