"""FAKE Google Cloud project for the gcp preflight tests: Service Usage, Compute Engine, Cloud Storage
(REST, through the `get(url, params)` of `infra.gcp.preflight.Google`) and Cloud Billing (the shape of
google-cloud-billing's `CloudBillingClient.get_project_billing_info`). NOT a cloud: it keeps one
project's state in dicts and answers as the real APIs do, each behaviour from its public source:

- A new project (`FakeProject()`) has the Kubernetes Engine and Compute Engine APIs DISABLED, the
  global GPUS_ALL_REGIONS quota and the regional GPU quotas at 0 (GKE docs, "Before you begin": enable
  the Kubernetes Engine API; Compute docs, "GPU quota": new projects have none; reference/FACTS.md).
- Service Usage `services.batchGet` (Service Usage REST reference): `names` of the form
  `projects/P/services/S`; the answer's services are named with the project NUMBER
  (`projects/123456789012/services/S`), each with `config.name` and `state` ENABLED or DISABLED.
- A call to a disabled API answers 403 PERMISSION_DENIED with "<API> has not been used in project N
  before or it is disabled", an `errors[]` reason `accessNotConfigured` and a google.rpc.ErrorInfo
  detail with reason SERVICE_DISABLED and the service (Google Cloud APIs, "Errors" / ErrorInfo;
  Compute keeps its v1 `errors[]` list beside it). Compute Engine answers so for `projects.get` and
  `regions.get` while compute.googleapis.com is disabled.
- Compute `projects.get` lists the global quotas, `regions.get` the regional ones, each
  {metric, limit, usage} (Compute REST reference, Project.quotas / Region.quotas); a metric the fake is
  not given is not listed, and an unknown region is 404 "The resource ... was not found". The vCPUs of
  a VM count against the quota of its machine family: `CPUS` for N1 and E2 (Quota.Metric CPUS, "Guest
  CPUs"), `A2_CPUS`, `G2_CPUS`, `A3_CPUS`, `N2_CPUS`, ... for the other series (Cloud Quotas
  terminology, "CPUS-PER-VM-FAMILY-per-project-region"; the Compute v1 Quota.Metric enum lists A2_CPUS,
  N2_CPUS, E2_CPUS beside CPUS; GoogleCloudPlatform/gcpdiag gcpdiag/lint/gce/warn_2022_005_cpu_quota.py).
  `create_instance` takes a VM's vCPUs from the quota of its family and refuses past the limit as
  Compute Engine does: 403 QUOTA_EXCEEDED "Quota 'A3_CPUS' exceeded. Limit: 0.0 in region us-central1."
  (the message GKE's node-pool operations and `instances.insert` report, errors[].reason quotaExceeded).
- Cloud Storage `buckets.testIamPermissions` (JSON API) answers only the permissions the caller HAS,
  without error for the others; a missing bucket is 404. `buckets.get?fields=iamConfiguration` gives
  `iamConfiguration.uniformBucketLevelAccess.enabled`; without storage.buckets.get it is 403.
- IAM `projects.serviceAccounts.list` pages its `accounts` (pageSize, nextPageToken) with email,
  uniqueId, displayName and description (service accounts take no labels); `get` and `delete` by
  email (404 once gone). A deleted account's bucket bindings stay, rewritten as
  `deleted:serviceAccount:EMAIL?uid=UNIQUE_ID` (IAM docs, "Delete service accounts").
- IAM `projects.serviceAccounts.create` (`create_account`): the account id is unique within the
  project; one already taken answers 409 ALREADY_EXISTS, "Service account ID already exists within
  project projects/P." (IAM REST reference, projects.serviceAccounts/create; the answer as
  terraform-provider-google reports it: GoogleCloudPlatform/marketing-analytics-jumpstart#200,
  hashicorp/terraform-provider-google#19112). A new account gets a new uniqueId, even with the id of
  one deleted before (IAM docs, "Delete service accounts": a new account with the same name is a
  separate identity and inherits none of the old one's roles).
- Cloud Storage `buckets.getIamPolicy` (`optionsRequestedPolicyVersion=3`) gives {version, etag,
  bindings: [{role, members, condition}]}; `setIamPolicy` (PUT) replaces it only if its etag is the
  current one, else 412 Precondition Failed (a read-modify-write that lost a race).
- Networks (Compute REST reference, `networks.get`, `subnetworks.get`): a project has the auto-mode
  `default` network unless it was made under the org policy `compute.skipDefaultNetworkCreation`
  (`networks` without it); a network is {name, autoCreateSubnetworks}; a missing network or subnetwork
  is 404 "The resource 'projects/P/global/networks/N' was not found".
- The Compute Engine default service account `NUMBER-compute@developer.gserviceaccount.com`, named by
  `projects.get` (`defaultServiceAccount`): IAM `serviceAccounts.get` gives it with `disabled`, 404 once
  deleted; `serviceAccounts.testIamPermissions` (POST) answers only the permissions the caller holds,
  `{}` when none (IAM REST reference); `act_as` False is an organisation that removed the owner's
  automatic grants (`iam.automaticIamGrantsForDefaultServiceAccounts`).
- Cloud Storage `buckets.get?fields=location,locationType` gives `location` upper case ("US-CENTRAL1")
  and `locationType` (https://cloud.google.com/storage/docs/json_api/v1/buckets); `objects.list` pages
  its `items` ({name, size}, size a decimal string) with `nextPageToken` until the last, `page_size`
  a page here (GCS: at most 1,000 and "may return fewer";
  https://cloud.google.com/storage/docs/json_api/v1/objects/list), filtered by `prefix`.
- Cloud Billing `projects.getBillingInfo`: {name, projectId, billingAccountName, billingEnabled}; when
  the caller may not read it, or the Cloud Billing API is disabled in the quota project, the client
  raises google.api_core.exceptions.PermissionDenied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from urllib.parse import urlparse

from gpucluster.infra.gcp.leftovers import IAM
from gpucluster.infra.gcp.preflight import COMPUTE, SERVICE_USAGE, STORAGE, api_error

TITLES = {"container.googleapis.com": "Kubernetes Engine API", "compute.googleapis.com": "Compute Engine API",
          "storage.googleapis.com": "Cloud Storage API"}


@dataclass
class Bucket:
    ubla: bool = True
    may_set_policy: bool = True
    may_get: bool = True
    location: str = "US-CENTRAL1"  # buckets.get: upper case; locationType region, dual-region, multi-region
    location_type: str = "region"
    objects: dict = field(default_factory=dict)  # name -> size in bytes (objects.list)


@dataclass
class FakeProject:
    project: str = "my-proj-42"
    number: str = "123456789012"
    enabled: set = field(default_factory=lambda: {"serviceusage.googleapis.com", "storage.googleapis.com"})
    global_quotas: dict = field(default_factory=lambda: {"GPUS_ALL_REGIONS": (0.0, 0.0),
                                                         "CPUS_ALL_REGIONS": (32.0, 0.0)})
    # a new project: the regional CPUS (N1, E2) and, beside it, one vCPU quota per machine family, those of the
    # GPU series at 0 (A2_CPUS, G2_CPUS, A3_CPUS: see the module docstring)
    regions: dict = field(default_factory=lambda: {"us-central1": {
        "CPUS": (24.0, 0.0), "NVIDIA_V100_GPUS": (0.0, 0.0), "PREEMPTIBLE_NVIDIA_V100_GPUS": (0.0, 0.0),
        "PREEMPTIBLE_CPUS": (0.0, 0.0), "IN_USE_ADDRESSES": (8.0, 0.0), "N2_CPUS": (24.0, 0.0),
        "A2_CPUS": (0.0, 0.0), "G2_CPUS": (0.0, 0.0), "A3_CPUS": (0.0, 0.0)}})
    billing_enabled: bool = True
    billing_readable: bool = True
    buckets: dict = field(default_factory=dict)
    accounts: dict = field(default_factory=dict)  # email -> {uniqueId, displayName, description}
    policies: dict = field(default_factory=dict)  # bucket -> {"etag": str, "bindings": [...]}
    uid: int = 100000000000000000000  # the last uniqueId given (IAM's are 21 digits)
    page_size: int = 2  # accounts per page (IAM pages its lists; small here so paging is exercised)
    calls: list = field(default_factory=list)
    networks: dict = field(default_factory=lambda: {"default": True})  # name -> auto mode
    subnetworks: set = field(default_factory=set)  # (region, name)
    node_account: str = "enabled"  # the Compute Engine default service account: enabled, disabled or deleted
    act_as: bool = True  # the caller holds iam.serviceAccounts.actAs on it

    # -- the REST transport ------------------------------------------------------------------
    def get(self, url: str, params=None) -> dict:
        self.calls.append((url, list(params or [])))
        if url.startswith(STORAGE) and urlparse(url).path.endswith("/iam"):
            return self._policy(url)
        if url.startswith(SERVICE_USAGE):
            return self._service_usage(url, params or [])
        if url.startswith(COMPUTE):
            return self._compute(url)
        if url.startswith(STORAGE):
            return self._storage(url, params or [])
        if url.startswith(IAM):
            return self._iam_get(url, dict(params or []))
        raise api_error(404, {"error": {"code": 404, "message": f"no such API in the fake: {url}"}})

    def delete(self, url: str) -> dict:
        self.calls.append(("DELETE", url))
        email = url.rsplit("/", 1)[-1]
        acct = self.accounts.pop(email, None)
        if acct is None:
            raise api_error(404, {"error": {"code": 404, "message": f"Service account {email} does not exist."}})
        for policy in self.policies.values():  # its bindings stay, as a deleted principal
            for b in policy["bindings"]:
                b["members"] = [f"deleted:{m}?uid={acct['uniqueId']}" if m == f"serviceAccount:{email}" else m
                                for m in b["members"]]
        return {}

    def post(self, url: str, body: dict) -> dict:
        self.calls.append(("POST", url))
        email = urlparse(url).path.rsplit("/", 1)[-1].split(":")[0]
        assert url.startswith(IAM) and url.endswith(":testIamPermissions") and email == self.compute_account, url
        self._iam_get(url.split(":testIamPermissions")[0], {})
        held = [p for p in body.get("permissions", []) if self.act_as and p == "iam.serviceAccounts.actAs"]
        return {"permissions": held} if held else {}

    @property
    def compute_account(self) -> str:
        return f"{self.number}-compute@developer.gserviceaccount.com"

    def put(self, url: str, body: dict) -> dict:
        self.calls.append(("PUT", url))
        bucket = urlparse(url).path.split("/storage/v1/b/", 1)[1].split("/")[0]
        policy = self.policies[bucket]
        if body.get("etag") != policy["etag"]:
            raise api_error(412, {"error": {"code": 412, "message": "Precondition Failed"}})
        self.policies[bucket] = {"etag": f"{policy['etag']}+", "bindings": body["bindings"]}
        return self._policy(url)

    def create_account(self, account_id: str, display_name: str = "", description: str = "") -> dict:
        email = f"{account_id}@{self.project}.iam.gserviceaccount.com"
        self.calls.append(("create account", account_id))
        if email in self.accounts:
            raise api_error(409, {"error": {
                "code": 409, "status": "ALREADY_EXISTS",
                "message": f"Service account {account_id} already exists within project projects/{self.project}.",
                "details": [{"@type": "type.googleapis.com/google.rpc.ResourceInfo",
                             "resourceName": f"projects/{self.project}/serviceAccounts/{email}"}]}})
        self.uid += 1
        self.accounts[email] = {"uniqueId": str(self.uid), "displayName": display_name, "description": description}
        return {"email": email, **self.accounts[email]}

    def _iam_get(self, url: str, params: dict) -> dict:
        path = urlparse(url).path
        if path.endswith("/serviceAccounts"):
            emails = sorted(self.accounts)
            start = int(params.get("pageToken") or 0)
            page = emails[start:start + self.page_size]
            body = {"accounts": [{"name": f"projects/{self.project}/serviceAccounts/{e}", "projectId": self.project,
                                  "email": e, **self.accounts[e]} for e in page]}
            if start + self.page_size < len(emails):
                body["nextPageToken"] = str(start + self.page_size)
            return body
        email = path.rsplit("/", 1)[-1]
        if email == self.compute_account and self.node_account != "deleted":
            return {"email": email, "disabled": self.node_account == "disabled"}
        if email not in self.accounts:
            raise api_error(404, {"error": {"code": 404, "message": f"Service account {email} does not exist."}})
        return {"email": email, **self.accounts[email]}

    def _policy(self, url: str) -> dict:
        bucket = urlparse(url).path.split("/storage/v1/b/", 1)[1].split("/")[0]
        policy = self.policies.setdefault(bucket, {"etag": "CAE=", "bindings": []})
        return {"kind": "storage#policy", "resourceId": f"projects/_/buckets/{bucket}", "version": 3,
                "etag": policy["etag"], "bindings": [dict(b, members=list(b["members"])) for b in policy["bindings"]]}

    def _disabled(self, service: str) -> Exception:
        message = (f"{TITLES.get(service, service)} has not been used in project {self.number} before or it is "
                   f"disabled. Enable it by visiting https://console.developers.google.com/apis/api/{service}/"
                   f"overview?project={self.number} then retry.")
        return api_error(403, {"error": {
            "code": 403, "message": message, "status": "PERMISSION_DENIED",
            "errors": [{"message": message, "domain": "usageLimits", "reason": "accessNotConfigured"}],
            "details": [{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "SERVICE_DISABLED",
                         "domain": "googleapis.com",
                         "metadata": {"service": service, "consumer": f"projects/{self.number}"}}]}})

    def _service_usage(self, url: str, params) -> dict:
        assert url == f"{SERVICE_USAGE}/projects/{self.project}/services:batchGet", url
        out = []
        for key, name in params:
            assert key == "names" and name.startswith(f"projects/{self.project}/services/"), name
            service = name.rsplit("/", 1)[-1]
            out.append({"name": f"projects/{self.number}/services/{service}", "parent": f"projects/{self.number}",
                        "config": {"name": service, "title": TITLES.get(service, service)},
                        "state": "ENABLED" if service in self.enabled else "DISABLED"})
        return {"services": out}

    def _compute(self, url: str) -> dict:
        if "compute.googleapis.com" not in self.enabled:
            raise self._disabled("compute.googleapis.com")
        path = urlparse(url).path.split("/compute/v1/", 1)[1].split("/")
        if path[:2] != ["projects", self.project]:
            raise api_error(403, {"error": {"code": 403, "message": "Required 'compute.projects.get' permission"}})
        if len(path) == 2:
            return {"name": self.project, "quotas": _rows(self.global_quotas),
                    "defaultServiceAccount": self.compute_account}
        missing = api_error(404, {"error": {"code": 404, "message": f"The resource '{'/'.join(path)}' was not found"}})
        if path[2:4] == ["global", "networks"]:
            if path[4] not in self.networks:
                raise missing
            return {"name": path[4], "autoCreateSubnetworks": self.networks[path[4]]}
        if path[4:5] == ["subnetworks"]:
            if (path[3], path[5]) not in self.subnetworks:
                raise missing
            return {"name": path[5], "region": path[3]}
        region = path[3]
        if region not in self.regions:
            raise api_error(404, {"error": {"code": 404, "message": f"The resource 'projects/{self.project}/regions/"
                                                                    f"{region}' was not found"}})
        return {"name": region, "quotas": _rows(self.regions[region])}

    def _storage(self, url: str, params) -> dict:
        path = urlparse(url).path.split("/storage/v1/b/", 1)[1].split("/")
        bucket = self.buckets.get(path[0])
        if bucket is None:
            raise api_error(404, {"error": {"code": 404, "message": "The specified bucket does not exist."}})
        if path[1:] == ["iam", "testPermissions"]:
            asked = [v for k, v in params if k == "permissions"]
            have = {"storage.buckets.setIamPolicy"} if bucket.may_set_policy else set()
            return {"kind": "storage#testIamPermissionsResponse", "permissions": [p for p in asked if p in have]}
        if not bucket.may_get:
            raise api_error(403, {"error": {"code": 403, "message": "caller does not have storage.buckets.get "
                                                                    "access to the Google Cloud Storage bucket."}})
        asked = dict(params)
        if path[1:] == ["o"]:
            names = sorted(n for n in bucket.objects if n.startswith(asked.get("prefix", "")))
            start = int(asked.get("pageToken") or 0)
            page = names[start:start + self.page_size]
            more = {"nextPageToken": str(start + self.page_size)} if start + self.page_size < len(names) else {}
            return {"items": [{"name": n, "size": str(bucket.objects[n])} for n in page], **more}
        if asked.get("fields") == "location,locationType":
            return {"location": bucket.location, "locationType": bucket.location_type}
        return {"iamConfiguration": {"bucketPolicyOnly": {"enabled": bucket.ubla},
                                     "uniformBucketLevelAccess": {"enabled": bucket.ubla},
                                     "publicAccessPrevention": "inherited"}}

    # -- google-cloud-billing's CloudBillingClient -------------------------------------------
    def get_project_billing_info(self, name: str):
        from google.api_core.exceptions import PermissionDenied

        self.calls.append(("billing", name))
        assert name == f"projects/{self.project}", name
        if not self.billing_readable:
            raise PermissionDenied("Cloud Billing API has not been used in project 123456789012 before or it is "
                                   "disabled.")
        return SimpleNamespace(name=f"{name}/billingInfo", project_id=self.project,
                               billing_account_name="billingAccounts/012345-6789AB-CDEF01" if self.billing_enabled
                               else "", billing_enabled=self.billing_enabled)

    def create_instance(self, region: str, machine_type: str, vcpus: int, spot: bool = False) -> None:
        """A VM of `machine_type` made in `region` (what a GKE node pool makes per node): its vCPUs are taken
        from its family's quota (PREEMPTIBLE_CPUS for spot where the project has it), refused past the limit."""
        from gpucluster.infra.gcp.shapes import cpu_quota_metric

        quotas = self.regions[region]
        metric = cpu_quota_metric(machine_type)
        if spot and quotas.get("PREEMPTIBLE_CPUS", (0.0, 0.0))[0] > 0:
            metric = "PREEMPTIBLE_CPUS"
        limit, usage = quotas.get(metric, (0.0, 0.0))
        if usage + vcpus > limit:
            raise api_error(403, {"error": {"code": 403, "message": f"Quota '{metric}' exceeded.  Limit: {limit} in "
                                                                    f"region {region}.",
                                            "errors": [{"reason": "quotaExceeded", "domain": "usageLimits"}]}})
        quotas[metric] = (limit, usage + vcpus)

    def ready(self) -> "FakeProject":
        """The project after its owner enabled the APIs and got GPU and CPU quota: what a run needs."""
        self.enabled |= {"container.googleapis.com", "compute.googleapis.com"}
        self.global_quotas["GPUS_ALL_REGIONS"] = (16.0, 0.0)
        self.global_quotas["CPUS_ALL_REGIONS"] = (96.0, 0.0)
        self.regions["us-central1"]["NVIDIA_V100_GPUS"] = (8.0, 0.0)
        self.regions["us-central1"]["CPUS"] = (96.0, 0.0)
        # regions.get always lists the disk quotas (a new project often has only 250-500 GB of SSD: see
        # test_gcp_preflight; this one was raised, as a run of 4 nodes of 200 GB needs)
        self.regions["us-central1"].setdefault("SSD_TOTAL_GB", (2048.0, 0.0))
        self.regions["us-central1"].setdefault("DISKS_TOTAL_GB", (4096.0, 0.0))
        return self


def _rows(quotas: dict) -> list:
    return [{"metric": m, "limit": limit, "usage": usage} for m, (limit, usage) in quotas.items()]
