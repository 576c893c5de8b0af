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
owner, user, host, run: `description_marks`, read back as tags by `marks_from_description`) and the
buckets it was granted (`buckets=A,B`, read by the leftover scan: `leftovers.markers`), written by
`account_description`.
Outputs: `objects_service_account` (the GSA email), `objects_ksa`, `objects_namespace`,
`objects_grants` (each bucket binding in words, for a plan or a dry run).
"""

from __future__ import annotations

from typing import Sequence

import pulumi
import pulumi_gcp as gcp

from gpucluster.infra.gcp import gcs
from gpucluster.infra.gcp.marks import description_marks, marks_from_description  # noqa: F401 - part of this module's API
from gpucluster.states import JsonObject


def account_description(cluster_name: str, run_id: str | None, buckets: Sequence[str],
                        labels: dict[str, str] | None = None) -> str:
    """The account's marks (it takes no labels: `description_marks`, with the run), the buckets it is
    granted (the leftover scan reads both, `leftovers.markers`) and what it is for, at most 256
    characters: the bucket list is cut before the marks would be."""
    marks = description_marks(cluster_name, {**({"gpucluster-run": run_id} if run_id else {}), **(labels or {})})
    names = sorted(dict.fromkeys(buckets))
    tail = ": the pods' account for Cloud Storage (--data/--output gs://), via Workload Identity"
    while True:
        text = (f"{marks}, buckets={','.join(names)}" if names else marks) + tail
        if len(text) <= 256:
            return text
        if len(text) - len(tail) <= 256:
            tail = ""
        elif names:
            names.pop()  # whole names only: a cut name would name another bucket
        else:
            return text[:256]  # marks alone this long (a long user or host name): its end is cut


def declare_object_access(parent: pulumi.Resource, resource_name: str, *, cluster_name: str, project: str,
                          namespace: str | None, reads: Sequence[str], writes: Sequence[str],
                          cluster: pulumi.Resource, labels: dict[str, str] | None = None,
                          run_id: str | None = None) -> JsonObject:
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
        description=account_description(cluster_name, run_id, [b["bucket"] for b in gcs.iam_bindings(reads, writes)],
                                        labels),
        opts=child,
    )
    member = account.email.apply(lambda email: f"serviceAccount:{email}")
    rows = gcs.iam_bindings(reads, writes)
    declared: list[pulumi.CustomResource] = []
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


def grant_line(b: JsonObject) -> str:
    """One binding in words: "roles/storage.objectViewer on gs://data-bkt if <condition>"."""
    return f"{b['role']} on gs://{b['bucket']}" + (f" if {b['condition_expression']}" if b["condition_expression"]
                                                   else " (the whole bucket)")
