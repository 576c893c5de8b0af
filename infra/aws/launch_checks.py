"""The preflight's checks of the launch itself, as the program makes it: one launch template, then
one EC2 Fleet of type `instant` from it (component.py). Asked before anything is created.

What each API call of the launch needs, and how it is checked here:

- `CreateLaunchTemplate` takes `DryRun` and needs nothing to exist yet, so it is dry-run with the
  program's template data (image, root volume, IMDSv2, shutdown behaviour, the tags of the template,
  its instances, volumes and interfaces); the references to resources the run will create (key
  pair, security group, subnet, placement group, instance profile) are left out. EC2 answers
  `DryRunOperation` when the caller may make the call and `UnauthorizedOperation` otherwise (EC2 API
  reference, CommonParameters "DryRun").
- `CreateFleet` has a `DryRun` parameter too, but its request must name an existing launch template:
  `LaunchTemplateConfigs` is required and each `LaunchTemplateSpecification` names a template by id
  or name (botocore's EC2 model, CreateFleetRequest / FleetLaunchTemplateSpecificationRequest).
  Karpenter's own authorization check dry-runs CreateFleet only after it has made a real template
  (aws/karpenter-provider-aws, pkg/controllers/nodeclass/validation.go). Before anything is created
  there is no template, so `ec2:CreateFleet` is checked with IAM's policy simulator (permissions.py:
  the row "IAM permissions"), and named as unverified when the simulator cannot run.
- An instant fleet launches its instances with the caller's `ec2:RunInstances`: "Resource-level
  permissions for [CreateFleet] do not include the resources specified in a launch template ... you
  must include the resources in the RunInstances action statement" (Service Authorization Reference,
  Amazon EC2, CreateFleet). So the RunInstances dry run of preflight.py stays: the exact instances.
- Service-linked roles. "An instant EC2 Fleet does not require" AWSServiceRoleForEC2Fleet (EC2 User
  Guide, EC2 Fleet prerequisites), so an on-demand run needs none. Spot instances need
  AWSServiceRoleForEC2Spot: "If you use the AWS CLI or an API to request a Spot Instance, you must
  first ensure that this role exists" (EC2 User Guide, Service-linked role for Spot Instance
  requests). EC2 makes it on the first spot launch with the caller's credentials when they may
  `iam:CreateServiceLinkedRole`; when they may not, an instant fleet launches nothing and reports
  `AuthFailure.ServiceLinkedRoleCreationNotPermitted` ("The provided credentials do not have
  permission to create the service-linked role for EC2 Spot Instances": kubernetes/kops#16475,
  Karpenter's instant fleets; terraform-aws-modules/terraform-aws-eks#2670). The check: the role's
  path `/aws-service-role/spot.amazonaws.com/` in `ListRoles` (which PowerUserAccess allows), else
  the simulator for `iam:CreateServiceLinkedRole` with `iam:AWSServiceName = spot.amazonaws.com`.
"""

from __future__ import annotations

from gpucluster.spec import ClusterSpec
from gpucluster.states import JsonObject

from . import catalog
from .permissions import principal
from .rootdisk import root_disk_gb, snapshot_gb
from .sdk import Ec2Client, IamClient

SPOT_SERVICE = "spot.amazonaws.com"
SPOT_ROLE = "AWSServiceRoleForEC2Spot"
SPOT_ROLE_PATH = f"/aws-service-role/{SPOT_SERVICE}/"
CREATE_SPOT_ROLE = f"aws iam create-service-linked-role --aws-service-name {SPOT_SERVICE}"


def _row(name: str, ok: bool | None, detail: str, fix: str = "") -> JsonObject:
    return {"check": name, "ok": ok, "detail": detail, "fix": fix if ok is False else ""}


def _code(exc: Exception) -> tuple[str, str]:
    err = getattr(exc, "response", {}).get("Error", {}) if hasattr(exc, "response") else {}
    return str(err.get("Code") or type(exc).__name__), str(err.get("Message") or exc).split("\n")[0][:300]


def template_request(spec: ClusterSpec, image: JsonObject) -> JsonObject:
    """The CreateLaunchTemplate dry run: the program's template (component.GpuCluster._node_template)
    without the resources the run has not made yet."""
    tags = spec.managed_tags()

    def tagged(kind: str, name: str) -> JsonObject:
        return {"ResourceType": kind, "Tags": [{"Key": k, "Value": v} for k, v in {**tags, "Name": name}.items()]}

    return {
        "DryRun": True,
        "LaunchTemplateName": f"{spec.name}-nodes-preflight",
        "LaunchTemplateData": {
            "ImageId": image["ImageId"],
            "MetadataOptions": {"HttpEndpoint": "enabled", "HttpTokens": "required"},
            "BlockDeviceMappings": [{"DeviceName": image.get("RootDeviceName") or "/dev/sda1", "Ebs": {
                "VolumeType": catalog.DEFAULT_DISK_TYPE, "VolumeSize": root_disk_gb(spec.disk_gb, snapshot_gb(
                    image.get("RootDeviceName"), image.get("BlockDeviceMappings", []))), "Encrypted": True,
                "DeleteOnTermination": True}}],
            "InstanceInitiatedShutdownBehavior": "terminate",
            "TagSpecifications": [tagged("instance", f"{spec.name}-node"), tagged("volume", f"{spec.name}-node-root"),
                                  tagged("network-interface", f"{spec.name}-node-eni")],
        },
        "TagSpecifications": [tagged("launch-template", f"{spec.name}-nodes")],
    }


def template_dry_run(ec2: Ec2Client, spec: ClusterSpec, image: JsonObject, region: str) -> JsonObject:
    """CreateLaunchTemplate with DryRun: may these credentials make the nodes' launch template (and tag it)?"""
    from botocore.exceptions import BotoCoreError, ClientError

    name = f"EC2 CreateLaunchTemplate dry run ({region})"
    try:
        ec2.create_launch_template(**template_request(spec, image))
    except (BotoCoreError, ClientError) as exc:
        code, msg = _code(exc)
        if code == "DryRunOperation":
            return _row(name, True, "the nodes' launch template (and its tags) would be accepted")
        if code == "UnauthorizedOperation":
            return _row(name, False, f"permission ec2:CreateLaunchTemplate is denied in {region}: every node is "
                                     f"launched from one launch template ({msg})",
                        "grant ec2:CreateLaunchTemplate, ec2:DeleteLaunchTemplate and ec2:CreateTags on "
                        "launch-template resources to these credentials; read the reason with "
                        "`aws sts decode-authorization-message --encoded-message MESSAGE`")
        return _row(name, False, f"{code} in {region} for the nodes' launch template: {msg}",
                    "fix the request and retry (`gpucluster doctor --cloud aws` repeats this check)")
    return _row(name, False, "EC2 did not answer DryRunOperation to a DryRun request", "report this as a bug")


def _simulate_spot_role(iam: IamClient, caller_arn: str, account: str) -> str:
    """The simulator's decision on iam:CreateServiceLinkedRole for EC2 Spot; raises when it cannot run."""
    source = principal(caller_arn)
    if source is None:
        raise ValueError(f"{caller_arn} cannot be simulated (the root user or a federated user)")
    part = source.split(":")[1]
    resp = iam.simulate_principal_policy(
        PolicySourceArn=source, ActionNames=["iam:CreateServiceLinkedRole"],
        ResourceArns=[f"arn:{part}:iam::{account}:role{SPOT_ROLE_PATH}{SPOT_ROLE}"],
        ContextEntries=[{"ContextKeyName": "iam:AWSServiceName", "ContextKeyValues": [SPOT_SERVICE],
                         "ContextKeyType": "string"}])
    return str(next((r["EvalDecision"] for r in resp.get("EvaluationResults", [])), "implicitDeny"))


def service_linked_roles(iam: IamClient, spec: ClusterSpec, caller_arn: str, account: str, region: str) -> JsonObject:
    """The service-linked role the launch needs: none on demand (an instant fleet), EC2 Spot's for spot."""
    name = "EC2 service-linked roles"
    if not spec.spot:
        return _row(name, True, "none needed: the nodes launch as an instant EC2 Fleet, which does not need "
                                "AWSServiceRoleForEC2Fleet, and on demand (no AWSServiceRoleForEC2Spot)")
    seen = ""
    try:
        pages = iam.get_paginator("list_roles").paginate(PathPrefix=SPOT_ROLE_PATH)
        if any(page.get("Roles") for page in pages):
            return _row(name, True, f"{SPOT_ROLE} exists (spot instances are launched with it)")
        seen = f"the account has no {SPOT_ROLE}"
    except Exception as exc:  # noqa: BLE001 - an unreadable role list: ask the simulator instead
        seen = f"whether the account has {SPOT_ROLE} is unknown ({_code(exc)[0]}: needs iam:ListRoles)"
    try:
        decision = _simulate_spot_role(iam, caller_arn, account)
    except Exception as exc:  # noqa: BLE001 - AccessDenied, root, federated: a note
        return _row(name, None, f"{seen}, and whether {caller_arn} may create it is unknown ({_code(exc)[0]}: needs "
                                f"iam:SimulatePrincipalPolicy); if a spot run fails with "
                                f"AuthFailure.ServiceLinkedRoleCreationNotPermitted, run `{CREATE_SPOT_ROLE}` once")
    if decision == "allowed":
        return _row(name, True, f"{seen}; EC2 makes it at the first spot launch ({caller_arn} may "
                                f"iam:CreateServiceLinkedRole for {SPOT_SERVICE})")
    return _row(name, False,
                f"--spot in {region} needs the service-linked role {SPOT_ROLE}: {seen}, and {caller_arn} may not "
                f"iam:CreateServiceLinkedRole for {SPOT_SERVICE} ({decision}), so the fleet would launch nothing "
                "(AuthFailure.ServiceLinkedRoleCreationNotPermitted)",
                f"have an administrator run `{CREATE_SPOT_ROLE}` once for the account, or grant "
                f"iam:CreateServiceLinkedRole (condition iam:AWSServiceName = {SPOT_SERVICE}) to "
                f"{caller_arn}, or run without --spot")
