"""The AWS permissions a run needs, and their check with IAM's policy simulator (preflight, doctor).

A run needs EC2 permissions only, unless its nodes need an instance role: object storage
(`--data`/`--output s3://...`, options s3Read/s3Write) or option `ssm=true` (Session Manager and
SSM Run Command on the nodes). Only then does the program create an IAM role, its policies and an
instance profile, and only then does the launch need `iam:PassRole` (component.py). Credentials
like AWS's PowerUserAccess (everything but `iam:*`, except `iam:ListRoles` and service-linked
roles) can therefore run a default cluster.

The check: `iam:SimulatePrincipalPolicy` for the caller (the user, or the role behind an assumed-role
session) and the actions the run needs, with the resource ARNs the program would create and the
`iam:PassedToService` context of `iam:PassRole`. The simulator applies identity policies, permission
boundaries and Organizations SCPs (IAM API reference, SimulatePrincipalPolicy:
https://docs.aws.amazon.com/IAM/latest/APIReference/API_SimulatePrincipalPolicy.html); each result's
`EvalDecision` is `allowed`, `explicitDeny` or `implicitDeny`. Callers that cannot be simulated (the
root user, federated users, credentials without `iam:SimulatePrincipalPolicy`) get a note that lists
what the run needs; the RunInstances dry run still checks the launch itself.
"""

from __future__ import annotations

import re
from gpucluster.spec import ClusterSpec
from gpucluster.states import JsonObject

from . import catalog
from .catalog import role_reasons
from .efa import needs_addresses
from .sdk import IamClient

# What pulumi-aws (terraform-provider-aws) calls for the resources of component.py, create to delete.
EC2_NETWORK = (  # a new VPC (leave out with option subnetId)
    "ec2:CreateVpc", "ec2:ModifyVpcAttribute", "ec2:DescribeVpcs", "ec2:DescribeVpcAttribute", "ec2:DeleteVpc",
    "ec2:CreateInternetGateway", "ec2:AttachInternetGateway", "ec2:DescribeInternetGateways",
    "ec2:DetachInternetGateway", "ec2:DeleteInternetGateway", "ec2:CreateSubnet", "ec2:ModifySubnetAttribute",
    "ec2:DescribeSubnets", "ec2:DeleteSubnet", "ec2:CreateRouteTable", "ec2:CreateRoute", "ec2:AssociateRouteTable",
    "ec2:DescribeRouteTables", "ec2:DisassociateRouteTable", "ec2:DeleteRouteTable",
)
EC2_CLUSTER = (
    "ec2:CreateSecurityGroup", "ec2:DescribeSecurityGroups", "ec2:DescribeSecurityGroupRules",
    "ec2:AuthorizeSecurityGroupIngress", "ec2:AuthorizeSecurityGroupEgress", "ec2:RevokeSecurityGroupEgress",
    "ec2:RevokeSecurityGroupIngress", "ec2:DeleteSecurityGroup", "ec2:CreatePlacementGroup",
    "ec2:DescribePlacementGroups", "ec2:DeletePlacementGroup", "ec2:ImportKeyPair", "ec2:DescribeKeyPairs",
    "ec2:DeleteKeyPair", "ec2:DescribeImages", "ec2:DescribeInstanceTypeOfferings", "ec2:DescribeInstanceTypes",
    "ec2:RunInstances", "ec2:CreateTags", "ec2:DescribeInstances", "ec2:DescribeInstanceAttribute",
    "ec2:DescribeVolumes", "ec2:TerminateInstances", "ec2:GetConsoleOutput",
    # the destroy of the security group and subnet looks for interfaces left on them (terraform-provider-
    # aws vpc_security_group.go / vpc_subnet.go: deleteLingeringENIs, DescribeNetworkInterfaces)
    "ec2:DescribeNetworkInterfaces",
    # every node from one launch template through one instant EC2 Fleet (all or none)
    "ec2:CreateLaunchTemplate", "ec2:DescribeLaunchTemplates", "ec2:DescribeLaunchTemplateVersions",
    "ec2:DeleteLaunchTemplate", "ec2:CreateFleet", "ec2:DescribeFleets", "ec2:DeleteFleets",
)
EC2_EFA: tuple[str, ...] = ()  # the EFA interfaces are in the same launch template
# with EFA on every network card, an Elastic IP per node (efa.py, interfaces.py): pulumi-aws's aws_eip
# (ec2_eip.go: AllocateAddress, AssociateAddress, DescribeAddresses, DescribeAddressesAttribute, its delete
# DisassociateAddress and ReleaseAddress)
EC2_ADDRESSES = ("ec2:AllocateAddress", "ec2:AssociateAddress", "ec2:DescribeAddresses",
                 "ec2:DescribeAddressesAttribute", "ec2:DisassociateAddress", "ec2:ReleaseAddress")
# the node role (only with a reason for one: `role_reasons`)
IAM_ROLE = (
    "iam:CreateRole", "iam:GetRole", "iam:TagRole", "iam:PutRolePolicy", "iam:GetRolePolicy", "iam:ListRolePolicies",
    "iam:ListAttachedRolePolicies", "iam:ListInstanceProfilesForRole", "iam:DeleteRolePolicy", "iam:DeleteRole",
    "iam:PassRole",
)
IAM_SSM = ("iam:AttachRolePolicy", "iam:DetachRolePolicy")
IAM_PROFILE = ("iam:CreateInstanceProfile", "iam:GetInstanceProfile", "iam:TagInstanceProfile",
               "iam:AddRoleToInstanceProfile", "iam:RemoveRoleFromInstanceProfile", "iam:DeleteInstanceProfile")
# what the teardown check reads to prove no role or profile of the cluster is left (leftovers.py)
VERIFY_IAM = ("iam:ListRoles", "iam:ListRoleTags", "iam:ListInstanceProfiles", "iam:GetInstanceProfile")
# what the tag scan lists in every region it checks, whatever the run made (leftovers.scan), and what its
# delete by tag may call on what it finds (leftovers.delete / _delete_one): a run without them is
# "not verified" (exit 3), or leaves what the scan found. Kept in step with leftovers.py by
# tests/test_aws_teardown.py (every boto3 call there is one of these, or of EC2_NETWORK/EC2_CLUSTER).
VERIFY_EC2 = (
    "ec2:DescribeInstances", "ec2:DescribeFleets", "ec2:DescribeLaunchTemplates", "ec2:DescribeVolumes",
    "ec2:DescribeSecurityGroups", "ec2:DescribeKeyPairs", "ec2:DescribePlacementGroups",
    "ec2:DescribeNetworkInterfaces", "ec2:DescribeAddresses", "ec2:DescribeSubnets", "ec2:DescribeRouteTables",
    "ec2:DescribeInternetGateways", "ec2:DescribeVpcs",
    "ec2:DeleteVolume", "ec2:DeleteNetworkInterface", "ec2:DisassociateAddress", "ec2:ReleaseAddress",
)
VERIFY = VERIFY_IAM + VERIFY_EC2


def needed(spec: ClusterSpec) -> dict[str, tuple[str, ...]]:
    """The actions a run of `spec` needs, by what they are for."""
    ec2 = (() if catalog.option(spec, "subnetId") else EC2_NETWORK) + EC2_CLUSTER
    if catalog.efa_requested(spec):
        ec2 += EC2_EFA
    if needs_addresses(spec):
        ec2 += EC2_ADDRESSES
    out = {"EC2": ec2}
    if role_reasons(spec):
        out["IAM (the node role)"] = IAM_ROLE + (IAM_SSM if catalog.flag(spec, "ssm") else ()) + IAM_PROFILE
    out["the teardown check (tag scan and delete by tag)"] = tuple(a for a in VERIFY if a not in ec2)
    return out


def summary(spec: ClusterSpec) -> str:
    """One line for `doctor`: what a run of this spec needs."""
    groups = needed(spec)
    why = role_reasons(spec)
    text = "; ".join(f"{k}: {', '.join(v)}" for k, v in groups.items())
    role = (f"an instance role because of {', '.join(why)}" if why else
            "no IAM writes (no instance role: a run with --data/--output s3:// or option ssm=true also needs "
            + ", ".join(IAM_ROLE + IAM_PROFILE) + ")")
    spot = ("; --spot also needs the account's service-linked role AWSServiceRoleForEC2Spot, or "
            "iam:CreateServiceLinkedRole (iam:AWSServiceName = spot.amazonaws.com) so that EC2 makes it at the first "
            "spot launch (an on-demand run needs no service-linked role)" if spec.spot else "")
    return f"{role}; {text}{spot}"


def principal(caller_arn: str) -> str | None:
    """The IAM ARN to simulate for an STS caller ARN: a user as is, an assumed-role session's role
    (arn:aws:sts::A:assumed-role/R/S -> arn:aws:iam::A:role/R; a role under a path is not found
    then, and the check becomes a note); None for the root user and federated users."""
    m = re.fullmatch(r"arn:(aws[\w-]*):sts::(\d+):assumed-role/([^/]+)/.+", caller_arn or "")
    if m:
        return f"arn:{m.group(1)}:iam::{m.group(2)}:role/{m.group(3)}"
    if re.fullmatch(r"arn:aws[\w-]*:iam::\d+:(user|role)/.+", caller_arn or ""):
        return caller_arn
    return None


def _decisions(iam: IamClient, source: str, actions: tuple[str, ...], resources: list[str] | None = None,
               context: list[JsonObject] | None = None) -> dict[str, str]:
    kw: JsonObject = {"PolicySourceArn": source, "ActionNames": list(actions)}
    if resources:
        kw["ResourceArns"] = resources
    if context:
        kw["ContextEntries"] = context
    out: dict[str, str] = {}
    while True:
        resp = iam.simulate_principal_policy(**kw)
        for r in resp.get("EvaluationResults", []):
            missing = r.get("MissingContextValues") or []
            # not allowed only for want of keys the real call may carry (a policy's condition on a tag, a
            # VPC, ...): unverified, not denied (issue 40 item 7)
            out[r["EvalActionName"]] = (f"unverified:{','.join(missing)}" if missing and r["EvalDecision"] != "allowed"
                                        else r["EvalDecision"])
        if not resp.get("IsTruncated"):
            return out
        kw["Marker"] = resp["Marker"]


def request_context(spec: ClusterSpec) -> list[JsonObject]:
    """The condition keys the program's EC2 calls carry, for the simulator: without them a policy's
    condition on them (an Organizations SCP that denies other regions, Control Tower's region deny; one
    that requires IMDSv2) evaluates as if the key were absent, and a negated condition then matches
    (IAM User Guide, "Condition operators": "...IfExists", a missing key; "Testing IAM policies with
    the IAM policy simulator": context keys)."""
    region = catalog.region_of(spec)

    def key(name: str, value: str) -> JsonObject:
        return {"ContextKeyName": name, "ContextKeyValues": [value], "ContextKeyType": "string"}

    return [key("aws:RequestedRegion", region), key("ec2:Region", region),
            key("ec2:InstanceType", catalog.instance_type_of(spec).name),
            key("ec2:MetadataHttpTokens", "required"), key("ec2:MetadataHttpEndpoint", "enabled"),
            key("ec2:InstanceMarketType", "spot" if spec.spot else "on-demand")]


def denied(iam: IamClient, spec: ClusterSpec, caller_arn: str, account: str) -> list[str]:
    """The actions the run needs that the caller may not do (SimulatePrincipalPolicy); raises the
    client's error when the simulation cannot run. Those not allowed only for want of context keys
    are `unverified(...)`'s, not these."""
    return [a for a, d in decisions(iam, spec, caller_arn, account).items() if not d.startswith(("allowed", "unverified"))]


def unverified(found: dict[str, str]) -> list[str]:
    """The actions whose decision depends on context keys the simulator was not given, with those keys."""
    return [f"{a} ({d.split(':', 1)[1]})" for a, d in found.items() if d.startswith("unverified")]


def decisions(iam: IamClient, spec: ClusterSpec, caller_arn: str, account: str) -> dict[str, str]:
    """Each action the run needs -> the simulator's decision (allowed, implicitDeny, explicitDeny, or
    "unverified:KEYS"), the EC2 ones simulated with the request's context (`request_context`)."""
    source = principal(caller_arn)
    if source is None:
        raise ValueError(f"{caller_arn} cannot be simulated (the root user or a federated user)")
    part = source.split(":")[1]
    groups = needed(spec)
    found: dict[str, str] = {}
    found.update(_decisions(iam, source, tuple(dict.fromkeys(groups["EC2"] + VERIFY)), context=request_context(spec)))
    if "IAM (the node role)" in groups:
        # the names Pulumi gives them: the logical name plus a random suffix (component.py)
        role = f"arn:{part}:iam::{account}:role/{spec.name}-role-0000000"
        profile = f"arn:{part}:iam::{account}:instance-profile/{spec.name}-profile-0000000"
        role_actions = tuple(a for a in groups["IAM (the node role)"] if a not in IAM_PROFILE and a != "iam:PassRole")
        found.update(_decisions(iam, source, role_actions, [role]))
        found.update(_decisions(iam, source, ("iam:PassRole",), [role], [{
            "ContextKeyName": "iam:PassedToService", "ContextKeyValues": ["ec2.amazonaws.com"],
            "ContextKeyType": "string"}]))
        found.update(_decisions(iam, source, IAM_PROFILE, [profile]))
    wanted = [a for g in groups.values() for a in g]
    return {a: found.get(a, "implicitDeny") for a in dict.fromkeys(wanted)}


def check(iam: IamClient, spec: ClusterSpec, caller_arn: str, account: str) -> JsonObject:
    """The preflight row: failed when the launch or teardown needs an action that is denied; a note
    when only the teardown check's IAM reads are (the run works, its teardown ends "not verified"),
    or when the simulation cannot run."""
    name = "IAM permissions"
    why = role_reasons(spec)
    role = f"with an instance role ({', '.join(why)})" if why else "without IAM writes (no instance role)"
    try:
        found = decisions(iam, spec, caller_arn, account)
        refused = [a for a, d in found.items() if not d.startswith(("allowed", "unverified"))]
    except Exception as exc:  # noqa: BLE001 - any failure to simulate (AccessDenied, NoSuchEntity, root) is a note
        code = getattr(exc, "response", {}).get("Error", {}).get("Code") if hasattr(exc, "response") else None
        return {"check": name, "ok": None, "fix": "", "detail": (
            f"not checked ({code or exc}: needs iam:SimulatePrincipalPolicy on {caller_arn}), so ec2:CreateFleet is "
            "unverified (it has no dry run before its launch template exists; the template and instance dry "
            f"runs below still run); this run goes {role} and needs "
            + "; ".join(f"{k}: {', '.join(v)}" for k, v in needed(spec).items()))}
    writes = needed(spec).get("IAM (the node role)", ())
    launch = needed(spec)["EC2"]  # what the launch and the destroy call: never only the check's
    blocking = [a for a in refused if a not in VERIFY or a in writes or a in launch]
    reads = [a for a in refused if a not in blocking]
    if blocking:
        fix = (f"grant {', '.join(blocking)} to {principal(caller_arn)}"
               + (f", or run without {' and '.join(why)} (a run without them creates no IAM)"
                  if any(a.startswith("iam:") for a in blocking) and why else ""))
        return {"check": name, "ok": False, "fix": fix,
                "detail": f"{caller_arn} may not {', '.join(blocking)}, which a run {role} needs"}
    if reads:
        return {"check": name, "ok": None, "fix": "", "detail": (
            f"the run may go {role}, but the teardown check may not {', '.join(reads)}: it would end "
            "'not verified' (exit 3); grant them to verify that nothing of the cluster is left")}
    if unverified(found):
        return {"check": name, "ok": None, "fix": "", "detail": (
            f"not verified for {', '.join(unverified(found))}: a policy's condition needs keys the simulator "
            "was not given (the real call may carry them); the dry runs below still check the launch")}
    return {"check": name, "ok": True, "fix": "",
            "detail": f"every action a run {role} needs is allowed to {caller_arn}"}
