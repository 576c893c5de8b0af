"""Object storage for the pods of `gpucluster:gcp:GpuCluster` (`--data gs://...`, `--output gs://...`):
declared only when the spec has `gcsRead` / `gcsWrite` (`infra.gcp.gcs`), as children of the component.

- `serviceaccount.Account`: the Google service account (GSA) the pods act as, one per cluster
  (`gcs.account_id(cluster name)`), with no role in the project.
- `storage.BucketIAMMember`, one per `gcs.iam_bindings` row: objectViewer (reads) or objectCreator
  (writes) on the bucket, confined to the prefix by an IAM condition (needs uniform bucket-level
  access on that bucket), member `serviceAccount:<GSA email>`.
- `serviceaccount.IAMMember`: roles/iam.workloadIdentityUser on the GSA for
  `serviceAccount:<project>.svc.id.goog[<namespace>/<gcs.OBJECTS_KSA>]`, the Kubernetes service
  account the launcher creates (annotated `iam.gke.io/gcp-service-account: <GSA email>`) and runs
  the pods as (https://cloud.google.com/kubernetes-engine/docs/how-to/workload-identity). It waits
  for the cluster: the project's workload identity pool exists once a cluster with Workload
  Identity does. Namespace: the option `namespace` (the launcher's), else "default".

None of these take labels: the GSA's description carries the marks instead (managed-by, cluster,
owner, user, host, run: `description_marks`), read back as tags by `marks_from_description`.
Outputs: `objects_service_account` (the GSA email), `objects_ksa`, `objects_namespace`,
`objects_grants` (each bucket binding in words, for a plan or a dry run).
"""

from __future__ import annotations

from typing import Any, Sequence

import pulumi
import pulumi_gcp as gcp

from gpucluster.infra.gcp import gcs


def declare_object_access(parent: pulumi.Resource, resource_name: str, *, cluster_name: str, project: str,
                          namespace: str | None, reads: Sequence[str], writes: Sequence[str],
                          cluster: pulumi.Resource, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """The GSA, its bucket bindings and its Workload Identity binding; the outputs to add ({} when
    there is nothing to read or write)."""
    if not reads and not writes:
        return {}
    namespace = namespace or gcs.DEFAULT_NAMESPACE
    child = pulumi.ResourceOptions(parent=parent)
    account = gcp.serviceaccount.Account(
        f"{resource_name}-objects",
        account_id=gcs.account_id(cluster_name),
        project=project,
        display_name=f"gpucluster {cluster_name} pods"[:100],
        description=(description_marks(cluster_name, labels or {}) + ": what the cluster's pods read and write in "
                     "Cloud Storage (--data/--output gs://), via Workload Identity")[:256],
        opts=child,
    )
    member = account.email.apply(lambda email: f"serviceAccount:{email}")
    rows = gcs.iam_bindings(reads, writes)
    declared: list[pulumi.Resource] = []
    for i, b in enumerate(rows):
        condition = None
        if b["condition_expression"]:
            condition = gcp.storage.BucketIAMMemberConditionArgs(
                title=b["condition_title"], expression=b["condition_expression"],
                description=b["condition_description"])
        declared.append(gcp.storage.BucketIAMMember(
            f"{resource_name}-gcs-{'read' if b['role'] == gcs.READ_ROLE else 'write'}-{i}",
            bucket=b["bucket"], role=b["role"], member=member, condition=condition, opts=child))
    declared.append(gcp.serviceaccount.IAMMember(
        f"{resource_name}-objects-wi",
        service_account_id=account.name,
        role=gcs.WORKLOAD_IDENTITY_ROLE,
        member=gcs.workload_member(project, namespace, gcs.OBJECTS_KSA),
        opts=pulumi.ResourceOptions(parent=parent, depends_on=[cluster]),
    ))
    # what was granted, in words (known once every binding is declared)
    grants = pulumi.Output.all(*[r.id for r in declared]).apply(lambda _: [grant_line(b) for b in rows])
    return {"objects_service_account": account.email, "objects_ksa": gcs.OBJECTS_KSA,
            "objects_namespace": namespace, "objects_grants": grants}


DESCRIPTION_KEYS = ("managed-by", "gpucluster-cluster", "gpucluster-owner", "gpucluster-stack", "gpucluster-run",
                    "gpucluster-user", "gpucluster-host")


def description_marks(cluster_name: str, labels: dict[str, str]) -> str:
    """"managed-by=gpucluster, gpucluster-cluster=NAME, gpucluster-owner=ID, ...": the marks a
    service account carries where it takes no labels (who made it first: the description is cut at 256 characters)."""
    marks = {"managed-by": "gpucluster", "gpucluster-cluster": cluster_name,
             **{k: v for k, v in labels.items() if k in DESCRIPTION_KEYS[2:]}}
    return ", ".join(f"{k}={marks[k]}" for k in DESCRIPTION_KEYS if marks.get(k))


def marks_from_description(text: str) -> dict[str, str]:
    """The marks `description_marks` wrote, as a tag dict (what a scan compares like labels)."""
    out = {}
    for part in str(text or "").split(":", 1)[0].split(","):
        key, sep, value = part.strip().partition("=")
        if sep and key in DESCRIPTION_KEYS:
            out[key] = value.strip()
    return out


def grant_line(b: dict[str, Any]) -> str:
    """One binding in words: "roles/storage.objectViewer on gs://data-bkt if <condition>"."""
    return f"{b['role']} on gs://{b['bucket']}" + (f" if {b['condition_expression']}" if b["condition_expression"]
                                                   else " (the whole bucket)")
