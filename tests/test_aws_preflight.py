"""`run`/`up`/`doctor --cloud aws` preflight (infra/aws/preflight.py): a fresh account's first run
fails before anything is created, in one line, with the fix.

moto (5.2.5) is kinder than EC2 here, so `aws_strict.StrictSession` adds AWS's answers:
- GetServiceQuota: moto knows only the vpc service's quotas. EC2's G/VT quotas are counted in vCPUs
  (https://docs.aws.amazon.com/ec2/latest/instancetypes/ec2-instance-quotas.html); new accounts
  often have 0 for "Running On-Demand G and VT instances" (issue 25, and AWS's "request a quota
  increase" guidance on the same page).
- RunInstances DryRun: moto answers DryRunOperation to every request. EC2 answers the error the
  real request would get: UnauthorizedOperation, OptInRequired, PendingVerification, Unsupported
  (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html;
  DryRun: https://docs.aws.amazon.com/AWSEC2/latest/APIReference/CommonParameters.html).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))

boto3 = pytest.importorskip("boto3")
moto = pytest.importorskip("moto")

from aws_strict import AwsError, StrictSession, quota_rule  # noqa: E402

from gpucluster.errors import ExitCode  # noqa: E402
from gpucluster.infra.aws import doctor as aws_doctor  # noqa: E402
from gpucluster.infra.aws.preflight import GVT_ON_DEMAND, GVT_SPOT, PreflightError, checks, preflight  # noqa: E402
from gpucluster.spec import ClusterSpec  # noqa: E402

DLAMI = "Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.7 (Ubuntu 22.04) 20250601"


@pytest.fixture
def aws(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with moto.mock_aws():
        yield StrictSession("us-east-1")


def dlami_rule(snapshot_gb: int = 45):
    """DescribeImages for the DLAMI lookup (owner amazon, the name filter): moto ships no DLAMI."""

    def rule(params):
        if params.get("Owners") == ["amazon"]:
            names = [f["Values"][0] for f in params.get("Filters", []) if f["Name"] == "name"]
            assert names and names[0].startswith("Deep Learning OSS Nvidia Driver AMI GPU PyTorch 2.*")
            return {"Images": [{"ImageId": "ami-0dlami000000001", "Name": DLAMI, "CreationDate": "2025-06-01T00:00:00Z",
                                "RootDeviceName": "/dev/sda1", "State": "available", "Architecture": "x86_64",
                                "BlockDeviceMappings": [{"DeviceName": "/dev/sda1", "Ebs": {
                                    "SnapshotId": "snap-0abc", "VolumeSize": snapshot_gb, "VolumeType": "gp3"}}]}]}
        return None

    return rule


def spec(**kw):
    base = dict(cloud="aws", nodes=2, name="pf", region="us-east-1", instance_type="g5.xlarge")
    base.update(kw)
    return ClusterSpec(**base)


def created_nothing(session):
    ec2 = session.real.client("ec2", region_name="us-east-1")
    running = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    return not running and all(v["IsDefault"] for v in ec2.describe_vpcs()["Vpcs"])


def test_fresh_account_quota_zero_fails_in_one_line_with_the_request_to_make(aws):
    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 0.0, GVT_SPOT: 0.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())
    with pytest.raises(PreflightError) as err:
        preflight(spec(), session=aws)
    msg = err.value.message
    assert err.value.exit_code == ExitCode.USAGE and "\n" not in msg
    assert "Running On-Demand G and VT instances in us-east-1" in msg
    assert "needs 2 × g5.xlarge = 8 vCPUs, 0 available (quota 0, 0 in use)" in msg
    assert ("aws service-quotas request-service-quota-increase --service-code ec2 --quota-code L-DB2E81BA "
            "--desired-value 8 --region us-east-1") in msg
    assert aws.seen("service-quotas", "GetServiceQuota") == [{"ServiceCode": "ec2", "QuotaCode": "L-DB2E81BA"}]
    assert created_nothing(aws)


def test_running_instances_count_against_the_quota_of_their_market_only(aws):
    ec2 = aws.real.client("ec2", region_name="us-east-1")
    ami = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2.run_instances(ImageId=ami, InstanceType="g5.2xlarge", MinCount=1, MaxCount=1)  # 8 on-demand vCPUs
    ec2.run_instances(ImageId=ami, InstanceType="g5.4xlarge", MinCount=1, MaxCount=1,
                      InstanceMarketOptions={"MarketType": "spot"})  # 16 spot vCPUs: not on-demand quota
    ec2.run_instances(ImageId=ami, InstanceType="m5.large", MinCount=1, MaxCount=1)  # not G/VT
    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 16.0, GVT_SPOT: 20.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())
    found = {c["check"]: c for c in checks(spec(nodes=2), session=aws)}
    q = found["EC2 quota L-DB2E81BA (us-east-1)"]
    assert q["ok"] is True and "8 of 16 vCPUs free (8 in use)" in q["detail"]
    with pytest.raises(PreflightError, match=r"needs 3 × g5.xlarge = 12 vCPUs, 8 available \(quota 16, 8 in use\).*"
                                             r"--quota-code L-DB2E81BA --desired-value 20 --region us-east-1"):
        preflight(spec(nodes=3), session=aws)
    # spot asks the spot quota, and counts the running spot instance (16 of 20 used)
    with pytest.raises(PreflightError, match=r"All G and VT Spot Instance Requests in us-east-1: the cluster needs "
                                             r"2 × g5.xlarge = 8 vCPUs, 4 available \(quota 20, 16 in use\).*"
                                             r"--quota-code L-3819A6DF --desired-value 24"):
        preflight(spec(spot=True), session=aws)
    assert aws.seen("service-quotas", "GetServiceQuota")[-1]["QuotaCode"] == "L-3819A6DF"


def test_dry_run_is_the_exact_launch_and_passes_when_ec2_would_accept_it(aws):
    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 64.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())
    preflight(spec(nodes=2, disk_gb=120), session=aws)
    (req,) = aws.seen("ec2", "RunInstances")
    assert req["DryRun"] is True and req["ImageId"] == "ami-0dlami000000001" and req["InstanceType"] == "g5.xlarge"
    assert req["MinCount"] == req["MaxCount"] == 2  # every node in one request
    assert req["Placement"] == {"AvailabilityZone": "us-east-1a"}  # the first zone offering g5.xlarge, as the program
    assert req["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 120
    assert "InstanceMarketOptions" not in req
    assert created_nothing(aws)


@pytest.mark.parametrize("code,region,needles", [
    ("UnauthorizedOperation", "us-east-1", ["permission ec2:RunInstances is denied in us-east-1",
                                            "decode-authorization-message"]),
    ("OptInRequired", "il-central-1", ["OptInRequired in il-central-1",
                                       "aws account enable-region --region-name il-central-1"]),
    ("PendingVerification", "us-east-1", ["PendingVerification in us-east-1", "up to 4 hours"]),
    ("Unsupported", "us-east-1", ["Unsupported in us-east-1 for 2 × g5.xlarge in us-east-1a",
                                  "choose another --instance-type"]),
    ("VcpuLimitExceeded", "us-east-1", ["VcpuLimitExceeded in us-east-1", "--quota-code L-DB2E81BA"]),
])
def test_each_dry_run_refusal_is_one_line_naming_the_code_region_and_fix(aws, code, region, needles):
    # EC2's answers to a DryRun request that would fail (errors-overview, CommonParameters "DryRun")
    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 64.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())

    def refuse(params):
        assert params["DryRun"] is True
        raise AwsError(code, f"FAKE {code} message", 403 if code == "UnauthorizedOperation" else 400)

    aws.on("ec2", "RunInstances", refuse)
    with pytest.raises(PreflightError) as err:
        preflight(spec(region=region), session=aws)
    msg = err.value.message
    assert "\n" not in msg and err.value.exit_code == ExitCode.USAGE
    for n in needles:
        assert n in msg


def test_disk_below_the_amis_snapshot_and_a_private_subnet_are_refused(aws):
    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 64.0}))
    aws.on("ec2", "DescribeImages", dlami_rule(snapshot_gb=45))
    # RunInstances refuses a root volume smaller than the image's snapshot (InvalidBlockDeviceMapping:
    # "Volume of size 30GB is smaller than snapshot", https://docs.aws.amazon.com/ebs/latest/userguide/ebs-creating-volume.html)
    with pytest.raises(PreflightError, match=r"disk gb 30 is below the root snapshot of ami-0dlami000000001 \(45 GB\); "
                                             r"allowed: 45 or more; fix: pass --disk-gb 45 or more"):
        preflight(spec(disk_gb=30), session=aws)
    ec2 = aws.real.client("ec2", region_name="us-east-1")
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    sub = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.1.0/24", AvailabilityZone="us-east-1c")["Subnet"]["SubnetId"]
    with pytest.raises(PreflightError, match=f"option subnetId '{sub}' has no route 0.0.0.0/0 to an internet gateway"):
        preflight(spec(options=(("subnetId", sub),)), session=aws)
    assert not aws.seen("ec2", "RunInstances")
    # give its VPC's main route table a default route to an internet gateway: public, launch in its AZ
    igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc)
    main = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["RouteTables"][0]["RouteTableId"]
    ec2.create_route(RouteTableId=main, DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
    preflight(spec(options=(("subnetId", sub),)), session=aws)
    assert aws.seen("ec2", "RunInstances")[-1]["SubnetId"] == sub


def test_doctor_checks_the_default_runs_region_and_shape_and_says_which(aws, monkeypatch):
    monkeypatch.setenv("AWS_REGION", "us-west-2")  # `run` ignores it: us-east-1 unless --region
    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 4.0}))  # room for ONE g5.xlarge
    aws.on("ec2", "DescribeImages", dlami_rule())
    found = aws_doctor.doctor(session=aws)
    assert found[0]["check"] == "aws region checked" and found[0]["detail"].startswith("us-east-1, for 2 x g5.xlarge")
    q = next(c for c in found if c["check"].startswith("EC2 quota"))
    assert q["ok"] is False and "needs 2 × g5.xlarge = 8 vCPUs, 4 available" in q["detail"]
    assert "--desired-value 8 --region us-east-1" in q["fix"]
    # the region and shape given
    found = aws_doctor.doctor("us-east-2", session=aws, nodes=1, instance_type="g5.xlarge")
    assert found[0]["detail"].startswith("us-east-2, for 1 x g5.xlarge")
    assert all(c["ok"] is not False for c in found), found
    assert {p["QuotaCode"] for p in aws.seen("service-quotas", "GetServiceQuota")} == {"L-DB2E81BA"}
    (bad,) = aws_doctor.doctor(session=aws, instance_type="g5.xlarg")
    assert bad["ok"] is False and "g5.xlarg" in bad["detail"]


def test_up_stops_at_preflight_with_exit_2_before_pulumi_or_the_ledger(aws, home, monkeypatch):
    pytest.importorskip("pulumi.automation")
    from pulumi_fake import FakePulumiCommand
    from test_automation import provider as fake_provider

    from gpucluster.cli import common, up
    from gpucluster.errors import UsageError
    from gpucluster.ledger.store import Ledger

    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 0.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())
    fake = FakePulumiCommand()
    p = fake_provider(fake)
    p._cloud_checks = lambda s: preflight(s, session=aws)
    monkeypatch.setattr(common, "provider_for", lambda cloud, **scope: p.scoped(**scope))
    with pytest.raises(UsageError, match="L-DB2E81BA") as err:
        up.up.main(["--cloud", "aws", "--name", "demo", "--ssh-cidr", "203.0.113.7/32", "--yes"],
                   standalone_mode=False)
    assert err.value.exit_code == ExitCode.USAGE
    assert "up" not in fake.verbs() and fake.stacks == {}
    assert Ledger.open_default().list_runs() == []
    assert created_nothing(aws)


# -- the credential check: once, in the run's region -------------------------------------------------
def test_the_preflight_asks_once_and_only_in_the_runs_region(aws, home, monkeypatch):
    """Before, the provider's credential check ran `doctor --cloud aws`, i.e. the whole preflight of the
    default shape in us-east-1 (quota, images, a dry run), and then the real one in the run's region."""
    pytest.importorskip("pulumi.automation")
    from pulumi_fake import FakePulumiCommand

    from gpucluster.infra.pulumi.engine import PulumiDriver
    from gpucluster.infra.pulumi.provider import PulumiProvider
    from gpucluster.infra.registry import plugin

    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 64.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())
    monkeypatch.setattr(boto3.session, "Session", lambda *a, **k: aws)
    p = PulumiProvider(plugin("aws"), driver=PulumiDriver(pulumi_command=FakePulumiCommand(),
                                                          program_runner=lambda s: None))
    p.preflight(spec(region="eu-west-1"))
    assert len(aws.seen("sts", "GetCallerIdentity")) == 1
    assert len(aws.seen("ec2", "RunInstances")) == 1
    assert {r for s, _, r in aws.regions if s != "iam"} == {"eu-west-1"}, aws.regions
    # `down` (no spec): the credentials alone, nothing else
    aws.calls.clear()
    p.preflight()
    assert [(s, o) for s, o, _ in aws.calls] == [("sts", "GetCallerIdentity")]


# -- IAM: no writes unless the nodes need a role; what is needed is simulated ---------------------------
def _as(aws, user, *docs):
    from aws_strict import simulator_rule, user_with

    who = user_with(aws, user, *docs)
    who.rules = dict(aws.rules)
    who.on("iam", "SimulatePrincipalPolicy", simulator_rule(who, f"arn:aws:iam::123456789012:user/{user}"))
    return who


S3 = ("s3://data-bkt/train",)


def test_power_user_credentials_run_a_default_cluster_and_are_refused_a_role(aws):
    """PowerUserAccess (all but iam:*) with ReadOnlyAccess (which allows iam:Simulate*): a default run
    needs no IAM writes; a run with --data s3:// needs a node role, refused before anything exists."""
    from aws_strict import aws_managed_document

    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 64.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())
    dev = _as(aws, "dev", aws_managed_document("PowerUserAccess"), aws_managed_document("ReadOnlyAccess"))
    found = {c["check"]: c for c in checks(spec(), session=dev)}
    assert found["IAM permissions"]["ok"] is True and "without IAM writes" in found["IAM permissions"]["detail"]
    sims = dev.seen("iam", "SimulatePrincipalPolicy")
    assert sims and all(s["PolicySourceArn"] == "arn:aws:iam::123456789012:user/dev" for s in sims)
    assert not any(a.startswith("iam:Create") for s in sims for a in s["ActionNames"])
    with pytest.raises(PreflightError) as err:
        preflight(spec(reads=S3), session=dev)
    msg = err.value.message
    assert "\n" not in msg and err.value.exit_code == ExitCode.USAGE
    assert "user/dev may not iam:CreateRole, " in msg and "iam:PassRole" in msg and "iam:CreateInstanceProfile" in msg
    assert "run without --data/--resume s3:// (read) (a run without them creates no IAM)" in msg
    passrole = [s for s in dev.seen("iam", "SimulatePrincipalPolicy") if s["ActionNames"] == ["iam:PassRole"]][-1]
    assert passrole["ResourceArns"] == ["arn:aws:iam::123456789012:role/pf-role-0000000"]
    assert passrole["ContextEntries"][0]["ContextKeyValues"] == ["ec2.amazonaws.com"]
    assert created_nothing(aws)


def test_pass_role_to_another_service_only_is_refused_by_name(aws):
    """iam:PassRole allowed only when passed to Lambda: EC2 launches are refused (the simulator applies
    the iam:PassedToService condition the preflight sends)."""
    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 64.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())
    doc = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "NotAction": "iam:PassRole", "Resource": "*"},
        {"Effect": "Allow", "Action": "iam:PassRole", "Resource": "*",
         "Condition": {"StringEquals": {"iam:PassedToService": "lambda.amazonaws.com"}}}]}
    ops = _as(aws, "ops", doc)
    with pytest.raises(PreflightError, match=r"user/ops may not iam:PassRole, which a run with an instance role"):
        preflight(spec(reads=S3), session=ops)
    doc["Statement"][1]["Condition"]["StringEquals"]["iam:PassedToService"] = "ec2.amazonaws.com"
    ok = _as(aws, "ops2", doc)
    assert next(c for c in checks(spec(reads=S3), session=ok) if c["check"] == "IAM permissions")["ok"] is True


def test_without_the_simulator_the_needs_are_a_note_and_doctor_lists_them(aws):
    from aws_strict import aws_managed_document

    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 64.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())
    pu = _as(aws, "pu", aws_managed_document("PowerUserAccess"))  # may not iam:SimulatePrincipalPolicy
    row = next(c for c in checks(spec(reads=S3), session=pu) if c["check"] == "IAM permissions")
    assert row["ok"] is None and "AccessDenied" in row["detail"] and "iam:PassRole" in row["detail"]
    found = aws_doctor.doctor(session=pu)
    need = found[-1]
    assert need["check"] == "aws permissions a run needs" and need["ok"] is None
    assert need["detail"].startswith("no IAM writes") and "ec2:RunInstances" in need["detail"]
    assert "iam:PassRole" in need["detail"]  # named as what a run with s3:// or ssm would need


# -- the launch as the program makes it: a launch template, one instant EC2 Fleet -------------------------
def test_the_launch_template_is_dry_run_as_the_program_makes_it(aws):
    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 64.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())
    found = {c["check"]: c for c in checks(spec(disk_gb=120), session=aws)}
    assert found["EC2 CreateLaunchTemplate dry run (us-east-1)"]["ok"] is True
    (req,) = aws.seen("ec2", "CreateLaunchTemplate")
    data = req["LaunchTemplateData"]
    assert req["DryRun"] is True and data["ImageId"] == "ami-0dlami000000001"
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 120
    assert data["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert {t["ResourceType"] for t in data["TagSpecifications"]} == {"instance", "volume", "network-interface"}
    (lt_tags,) = req["TagSpecifications"]  # tagging the template needs ec2:CreateTags on it
    assert lt_tags["ResourceType"] == "launch-template" and {"Key": "managed-by", "Value": "gpucluster"} in lt_tags["Tags"]
    # nothing refers to a resource the run has not made yet, and nothing was made
    assert not {"KeyName", "SecurityGroupIds", "NetworkInterfaces", "Placement", "IamInstanceProfile"} & set(data)
    assert aws.real.client("ec2", region_name="us-east-1").describe_launch_templates()["LaunchTemplates"] == []
    assert found["EC2 service-linked roles"]["ok"] is True and "instant EC2 Fleet" in found["EC2 service-linked roles"]["detail"]


def test_a_refused_launch_template_fails_the_preflight_naming_create_launch_template(aws):
    """Credentials that may RunInstances but not CreateLaunchTemplate (and no policy simulator to say so):
    the old preflight dry-ran RunInstances only and passed; the fleet then fails after the VPC exists."""
    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 64.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())

    def refuse(params):
        # EC2 answers a DryRun request the caller may not make with UnauthorizedOperation (HTTP 403),
        # one it may make with DryRunOperation (EC2 API reference, CommonParameters "DryRun"; Karpenter's
        # authorization check relies on exactly these two answers: aws/karpenter-provider-aws,
        # pkg/controllers/nodeclass/validation.go). moto answers DryRunOperation to every caller.
        assert params["DryRun"] is True
        raise AwsError("UnauthorizedOperation", "You are not authorized to perform this operation. "
                                                "Encoded authorization failure message: FAKE", 403)

    aws.on("ec2", "CreateLaunchTemplate", refuse)
    with pytest.raises(PreflightError) as err:
        preflight(spec(), session=aws)
    msg = err.value.message
    assert "\n" not in msg and err.value.exit_code == ExitCode.USAGE
    assert "permission ec2:CreateLaunchTemplate is denied in us-east-1" in msg
    assert "grant ec2:CreateLaunchTemplate, ec2:DeleteLaunchTemplate and ec2:CreateTags" in msg
    assert created_nothing(aws)


def test_a_denied_create_fleet_is_named_by_the_simulator(aws):
    """ec2:CreateFleet has no dry run before its launch template exists (launch_checks.py): the
    simulator decides it. An explicit Deny on it wins over ec2:* (IAM policy evaluation logic)."""
    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 64.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())
    doc = {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": ["ec2:*", "iam:SimulatePrincipalPolicy", "iam:List*", "iam:Get*"], "Resource": "*"},
        {"Effect": "Deny", "Action": "ec2:CreateFleet", "Resource": "*"}]}
    who = _as(aws, "nofleet", doc)
    with pytest.raises(PreflightError) as err:
        preflight(spec(), session=who)
    assert "user/nofleet may not ec2:CreateFleet, which a run without IAM writes (no instance role) needs" in err.value.message
    assert "fix: grant ec2:CreateFleet to arn:aws:iam::123456789012:user/nofleet" in err.value.message
    # without the simulator, the note says that ec2:CreateFleet went unverified
    row = next(c for c in checks(spec(), session=aws) if c["check"] == "IAM permissions")
    assert row["ok"] is None and "ec2:CreateFleet is unverified" in row["detail"]


SPOT_ROLE_PATH = "/aws-service-role/spot.amazonaws.com/"
EC2_ONLY = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Action": ["ec2:*", "iam:SimulatePrincipalPolicy", "iam:List*", "iam:Get*"], "Resource": "*"}]}


def test_spot_on_an_account_without_the_spot_role_needs_leave_to_create_it(aws):
    """A fresh account has no AWSServiceRoleForEC2Spot (moto's, too: no role at all). An instant fleet of
    spot instances then launches nothing with AuthFailure.ServiceLinkedRoleCreationNotPermitted unless the
    caller may iam:CreateServiceLinkedRole for spot.amazonaws.com (EC2 User Guide, "Service-linked role for
    Spot Instance requests": "you must first ensure that this role exists"; kubernetes/kops#16475 shows the
    fleet error). The old preflight never looked: it passed this account."""
    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 64.0, GVT_SPOT: 64.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())
    ec2_only = _as(aws, "ec2only", EC2_ONLY)
    with pytest.raises(PreflightError) as err:
        preflight(spec(spot=True), session=ec2_only)
    msg = err.value.message
    assert "\n" not in msg and err.value.exit_code == ExitCode.USAGE
    assert ("--spot in us-east-1 needs the service-linked role AWSServiceRoleForEC2Spot: the account has no "
            "AWSServiceRoleForEC2Spot, and arn:aws:iam::123456789012:user/ec2only may not iam:CreateServiceLinkedRole "
            "for spot.amazonaws.com (implicitDeny)") in msg
    assert "aws iam create-service-linked-role --aws-service-name spot.amazonaws.com" in msg
    sim = [s for s in ec2_only.seen("iam", "SimulatePrincipalPolicy") if s["ActionNames"] == ["iam:CreateServiceLinkedRole"]]
    assert sim[-1]["ContextEntries"][0] == {"ContextKeyName": "iam:AWSServiceName", "ContextKeyValues": ["spot.amazonaws.com"],
                                            "ContextKeyType": "string"}
    # doctor --spot finds it too, and its list of what a run needs names the role
    found = aws_doctor.doctor(session=ec2_only, spot=True)
    assert next(c for c in found if c["check"] == "EC2 service-linked roles")["ok"] is False
    assert "AWSServiceRoleForEC2Spot, or iam:CreateServiceLinkedRole" in found[-1]["detail"]
    assert "AWSServiceRoleForEC2Spot" not in aws_doctor.doctor(session=ec2_only)[-1]["detail"]
    # on demand needs no service-linked role: the same credentials pass
    preflight(spec(), session=ec2_only)
    # leave to make a service-linked role for another service only: still refused
    elb_only = _as(aws, "elbonly", EC2_ONLY, {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "iam:CreateServiceLinkedRole", "Resource": "*",
         "Condition": {"StringEquals": {"iam:AWSServiceName": "elasticloadbalancing.amazonaws.com"}}}]})
    with pytest.raises(PreflightError, match="may not iam:CreateServiceLinkedRole for spot.amazonaws.com"):
        preflight(spec(spot=True), session=elb_only)
    assert created_nothing(aws)


def test_spot_passes_when_the_role_exists_or_the_caller_may_create_it(aws):
    from aws_strict import aws_managed_document

    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 64.0, GVT_SPOT: 64.0}))
    aws.on("ec2", "DescribeImages", dlami_rule())
    # PowerUserAccess allows iam:CreateServiceLinkedRole: EC2 makes the role at the first spot launch
    dev = _as(aws, "dev", aws_managed_document("PowerUserAccess"), aws_managed_document("ReadOnlyAccess"))
    row = next(c for c in checks(spec(spot=True), session=dev) if c["check"] == "EC2 service-linked roles")
    assert row["ok"] is True and "EC2 makes it at the first spot launch" in row["detail"]
    # once the role exists (an administrator made it; moto names it differently, its path is AWS's), no
    # simulation is needed
    aws.real.client("iam").create_service_linked_role(AWSServiceName="spot.amazonaws.com")
    assert aws.real.client("iam").list_roles(PathPrefix=SPOT_ROLE_PATH)["Roles"]
    ec2_only = _as(aws, "ec2only", EC2_ONLY)
    row = next(c for c in checks(spec(spot=True), session=ec2_only) if c["check"] == "EC2 service-linked roles")
    assert row["ok"] is True and row["detail"].startswith("AWSServiceRoleForEC2Spot exists")
    assert not [s for s in ec2_only.seen("iam", "SimulatePrincipalPolicy")
                if s["ActionNames"] == ["iam:CreateServiceLinkedRole"]]
    # no simulator and no role: a note with the command, not a refusal
    aws.real.client("iam").delete_service_linked_role(
        RoleName=aws.real.client("iam").list_roles(PathPrefix=SPOT_ROLE_PATH)["Roles"][0]["RoleName"])
    row = next(c for c in checks(spec(spot=True), session=aws) if c["check"] == "EC2 service-linked roles")
    assert row["ok"] is None and "create-service-linked-role --aws-service-name spot.amazonaws.com" in row["detail"]


def test_a_default_disk_follows_the_image_and_a_given_one_below_it_is_refused(aws):
    # issue 42: no --disk-gb is max(100, root snapshot + 25) (infra/aws/rootdisk.py), so an image whose
    # snapshot grew past 100 GB still launches; a size the user gave is never raised, only refused
    aws.on("service-quotas", "GetServiceQuota", quota_rule({GVT_ON_DEMAND: 64.0}))
    aws.on("ec2", "DescribeImages", dlami_rule(snapshot_gb=120))
    rows = checks(spec(), session=aws)
    (ami,) = [c for c in rows if c["check"].startswith("AMI")]
    assert ami["ok"] and "disk 145 GB (default: max(100, root snapshot 120 + 25))" in ami["detail"]
    assert aws.seen("ec2", "RunInstances")[-1]["BlockDeviceMappings"][0]["Ebs"]["VolumeSize"] == 145
    assert aws.seen("ec2", "CreateLaunchTemplate")[-1]["LaunchTemplateData"]["BlockDeviceMappings"][0]["Ebs"][
        "VolumeSize"] == 145
    with pytest.raises(PreflightError, match=r"disk gb 100 is below the root snapshot of ami-0dlami000000001 "
                                             r"\(120 GB\); allowed: 120 or more; fix: pass --disk-gb 120 or more"):
        preflight(spec(disk_gb=100), session=aws)
    assert created_nothing(aws)
