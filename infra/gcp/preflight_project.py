"""Preflight checks of the project's shape (issue 41 items 5 and 7), beside `infra.gcp.preflight`'s APIs,
billing and quotas: what a hardened organisation's project may lack, which would otherwise fail inside
`pulumi up`, after the cluster's 5-10 minutes.

- The nodes' service account: the node pools run as the Compute Engine default service account (named by
  Compute `projects.get`, `defaultServiceAccount`). Creating a node pool that runs as a service account
  needs `iam.serviceAccounts.actAs` on it (GKE docs, "Use least privilege service accounts for your
  nodes"; IAM docs, "Service account impersonation": attaching a service account to a resource needs
  actAs, granted by roles/iam.serviceAccountUser); organisations that disable the automatic grants
  (`iam.automaticIamGrantsForDefaultServiceAccounts`) or delete or disable the account break it. Asked
  with IAM `projects.serviceAccounts.get` (404: deleted; `disabled: true`) and
  `projects.serviceAccounts.testIamPermissions` (its answer lists only the permissions the caller holds;
  none: `{}`).
- The network: the cluster goes on the option `network` (default `default`) and `subnetwork`; a project
  made under `compute.skipDefaultNetworkCreation` has no `default` network (Resource Manager docs,
  "Organization policy constraints"). Compute `networks.get` (404: missing); a custom-mode network
  (`autoCreateSubnetworks: false`) needs a subnetwork named (GKE docs, "Creating a cluster in an existing
  network": in a custom-mode network a subnet must be given), checked with `subnetworks.get` in the region.
"""

from __future__ import annotations

from typing import Any

from .leftovers import IAM
from .preflight import COMPUTE, ApiError, _check, _why

ACT_AS = "iam.serviceAccounts.actAs"
DEFAULT_NETWORK = "default"


def check_node_account(google: Any, project: str) -> dict[str, Any]:
    """The nodes' service account exists, is enabled, and the caller may act as it."""
    name = "gcp node service account"
    try:
        email = google.get(f"{COMPUTE}/projects/{project}").get("defaultServiceAccount")
    except Exception as exc:  # noqa: BLE001 - a disabled Compute API, a permission: noted
        return _check(name, None, f"not checked: Compute Engine answered {_why(exc)}")
    if not email:
        return _check(name, None, "not checked: Compute Engine names no default service account")
    try:
        account = google.get(f"{IAM}/projects/{project}/serviceAccounts/{email}")
    except ApiError as exc:
        if exc.status == 404:
            return _check(name, False, f"the node pools run as the Compute Engine default service account {email}, "
                                       "which does not exist (deleted)",
                          f"restore it within 30 days: gcloud beta iam service-accounts undelete ITS_UNIQUE_ID "
                          f"--project {project} (the unique id is in the audit log of its deletion)")
        return _check(name, None, f"not checked: IAM answered {_why(exc)}")
    except Exception as exc:  # noqa: BLE001 - transport errors: noted
        return _check(name, None, f"not checked: {_why(exc)}")
    if account.get("disabled"):
        return _check(name, False, f"the node pools run as {email}, which is disabled",
                      f"gcloud iam service-accounts enable {email} --project {project}")
    try:
        held = google.post(f"{IAM}/projects/{project}/serviceAccounts/{email}:testIamPermissions",
                           {"permissions": [ACT_AS]}).get("permissions") or []
    except Exception as exc:  # noqa: BLE001 - noted
        return _check(name, None, f"not checked whether you may act as {email}: {_why(exc)}")
    if ACT_AS not in held:
        return _check(name, False, f"the node pools run as {email}, and you may not act as it ({ACT_AS}), which "
                                   "creating them needs",
                      f"gcloud iam service-accounts add-iam-policy-binding {email} --member=user:YOU "
                      f"--role=roles/iam.serviceAccountUser --project {project}")
    return _check(name, True, f"{email}: enabled, and you may act as it")


def check_network(google: Any, project: str, region: str, network: str | None,
                  subnetwork: str | None) -> list[dict[str, Any]]:
    """The cluster's network exists (and its subnetwork in the region, when named or needed)."""
    net = network or DEFAULT_NETWORK
    name = f"gcp network {net}"
    try:
        body = google.get(f"{COMPUTE}/projects/{project}/global/networks/{net}")
    except ApiError as exc:
        if exc.status == 404:
            fix = (f"create it (gcloud compute networks create default --subnet-mode=auto --project {project}) or "
                   "name an existing one: --option network=NAME [--option subnetwork=NAME]") if not network else \
                  f"name an existing network: gcloud compute networks list --project {project}"
            return [_check(name, False, f"network {net!r} does not exist in {project}"
                                        + (" (projects made under compute.skipDefaultNetworkCreation have none)"
                                           if not network else ""), fix)]
        return [_check(name, None, f"not checked: Compute Engine answered {_why(exc)}")]
    except Exception as exc:  # noqa: BLE001 - transport errors: noted
        return [_check(name, None, f"not checked: {_why(exc)}")]
    custom = body.get("autoCreateSubnetworks") is False and not body.get("IPv4Range")
    if not subnetwork:
        if custom:
            return [_check(name, False, f"network {net!r} is a custom-mode network: the cluster needs a subnetwork "
                                        f"of it in {region} named",
                           f"--option subnetwork=NAME (gcloud compute networks subnets list --network {net} "
                           f"--regions {region} --project {project})")]
        return [_check(name, True, f"network {net!r} exists (auto mode: GKE uses its subnet in {region})")]
    sub = f"gcp subnetwork {subnetwork}"
    try:
        google.get(f"{COMPUTE}/projects/{project}/regions/{region}/subnetworks/{subnetwork}")
    except ApiError as exc:
        if exc.status == 404:
            return [_check(sub, False, f"subnetwork {subnetwork!r} does not exist in {region} of {project}",
                           f"name one of network {net!r} in {region}: gcloud compute networks subnets list "
                           f"--network {net} --regions {region} --project {project}")]
        return [_check(sub, None, f"not checked: Compute Engine answered {_why(exc)}")]
    except Exception as exc:  # noqa: BLE001 - noted
        return [_check(sub, None, f"not checked: {_why(exc)}")]
    return [_check(name, True, f"network {net!r} exists"), _check(sub, True, f"subnetwork {subnetwork!r} in {region}")]
