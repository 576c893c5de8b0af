"""`gpucluster run/up --cloud gcp --dry-run`: what a run would create, with no cloud and no credentials.

`dry_run(spec, job=None, launcher=None)` runs the real Pulumi program (`infra.program.run`, so
the component in `infra/gcp/component.py`) under Pulumi's mock runtime (`pulumi.runtime.set_mocks`), records every
resource it declares (type, name, the properties that matter for cost and behaviour, labels), builds
the Kubernetes manifests the launcher would apply from the mocked stack outputs, and adds the plan
notes and the estimate. Nothing is sent anywhere: the mocks answer the engine in-process.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pulumi

from gpucluster.errors import GpuclusterError
from gpucluster.spec import ClusterSpec
from gpucluster.states import JsonMapping, JsonObject

if TYPE_CHECKING:
    from gpucluster.costing.estimate import Estimate
    from gpucluster.infra.contract import Plugin
    from gpucluster.infra.kubernetes.launcher import KubernetesLauncher
    from gpucluster.watch.launch import JobSpec

PLACEHOLDER_PROJECT = "your-gcp-project"


class _Mocks(pulumi.runtime.Mocks):
    """Echo inputs as state; give the GKE cluster an endpoint and CA, a service account its email, like
    the real API would."""

    def __init__(self) -> None:
        self.resources: list[pulumi.runtime.MockResourceArgs] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs):
        self.resources.append(args)
        state = dict(args.inputs)
        state.setdefault("name", args.name)
        if args.typ == "gcp:container/cluster:Cluster":
            state.update(endpoint="192.0.2.10", masterAuth={"clusterCaCertificate": "ZHJ5LXJ1bg=="})
        if args.typ == "gcp:serviceaccount/account:Account":  # the email GCP gives a new account
            state.setdefault("email", f"{args.inputs.get('accountId')}@{args.inputs.get('project')}.iam.gserviceaccount.com")
        return [f"{args.name}-dry-run-id", state]

    def call(self, args: pulumi.runtime.MockCallArgs):
        return {}


def _declare(spec: ClusterSpec) -> tuple[_Mocks, JsonObject]:
    from gpucluster.infra import program

    mocks = _Mocks()
    pulumi.runtime.set_mocks(mocks, project="gpucluster", stack=spec.name, preview=True)
    outputs: JsonObject = {}
    error: list[GpuclusterError] = []

    @pulumi.runtime.test
    def go():
        try:
            declared = program.run(spec)
        except GpuclusterError as exc:
            error.append(exc)
            return None

        async def collect():
            for key, out in declared.items():
                outputs[key] = await out.future()

        return collect()

    go()
    if error:
        raise error[0]
    return mocks, outputs


def _ints(value: Any) -> Any:
    """The mock engine hands numbers back as floats: 2.0 -> 2."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


def _summary(args: pulumi.runtime.MockResourceArgs) -> JsonObject:
    i = _ints(dict(args.inputs))
    out: JsonObject = {"type": args.typ, "name": args.name}
    if args.typ == "gcp:container/cluster:Cluster":
        out.update(cluster=i.get("name"), project=i.get("project"), location=i.get("location"),
                   remove_default_node_pool=i.get("removeDefaultNodePool"),
                   deletion_protection=i.get("deletionProtection"),
                   release_channel=(i.get("releaseChannel") or {}).get("channel"), labels=i.get("resourceLabels"))
    elif args.typ == "gcp:container/nodePool:NodePool":
        cfg = i.get("nodeConfig") or {}
        acc = (cfg.get("guestAccelerators") or [{}])[0]
        scale = i.get("autoscaling")
        out.update(pool=i.get("name"), machine_type=cfg.get("machineType"),
                   accelerators=f"{acc['count']} x {acc['type']}" if acc else None,
                   driver=(acc.get("gpuDriverInstallationConfig") or {}).get("gpuDriverVersion") if acc else None,
                   nodes=(f"autoscaling {scale['minNodeCount']}..{scale['maxNodeCount']} (starts at "
                          f"{i.get('initialNodeCount')})" if scale else i.get("nodeCount")),
                   spot=cfg.get("spot", False), disk=f"{cfg.get('diskSizeGb')} GB {cfg.get('diskType')}",
                   taints=[f"{t['key']}={t['value']}:{t['effect']}" for t in cfg.get("taints") or []],
                   labels=cfg.get("resourceLabels"))
    elif args.typ == "gcp:serviceaccount/account:Account":  # the pods' identity for gs:// (component_access)
        out.update(account_id=i.get("accountId"), project=i.get("project"))
    elif args.typ == "gcp:storage/bucketIAMMember:BucketIAMMember":
        cond = (i.get("condition") or {}).get("expression")
        out.update(grants=f"{i.get('role')} on gs://{i.get('bucket')}" + (f" if {cond}" if cond else " (whole bucket)"))
    elif args.typ == "gcp:serviceaccount/iAMMember:IAMMember":
        out.update(grants=f"{i.get('role')} to {i.get('member')}")
    return out


def _manifests(outputs: JsonObject, job: JobSpec, launcher: KubernetesLauncher | None
               ) -> tuple[list[JsonObject], list[str]]:
    from kubernetes.client import ApiClient

    from gpucluster.infra.kubernetes import launcher as k8s, manifests as k8s_manifests, plan as k8s_plan
    from gpucluster.infra.kubernetes.stage import object_transfer

    from .component import cluster_from_outputs
    from .gke import GKE

    cluster = cluster_from_outputs(outputs)
    launcher = launcher or k8s.KubernetesLauncher(platform=GKE)
    account = launcher.platform.object_account(cluster, job)  # the pods' service account when they use gs://
    files, _ = object_transfer(launcher.objects, job)
    plan = k8s_plan.plan_job(cluster, job, namespace=launcher.namespace, image=launcher.image, mode=launcher.mode,
                             start_deadline_s=launcher.start_deadline_s,
                             service_account=account[0] if account else None, extra_files=files,
                             platform=launcher.platform)
    objects = [k8s_manifests.config_map_manifest(plan)]
    if plan.mode == "job":
        objects += [k8s_manifests.service_manifest(plan), k8s_manifests.job_manifest(plan)]
        objects = [ApiClient().sanitize_for_serialization(o) for o in objects]
    else:
        build = k8s_manifests.trainjob_manifest if plan.mode == "trainjob" else k8s_manifests.pytorchjob_manifest
        objects = [ApiClient().sanitize_for_serialization(objects[0]), build(plan)]
    cm = objects[0]
    sizes = {k: len(v) for k, v in {**(cm.get("data") or {}), **(cm.get("binaryData") or {})}.items()}
    cm["data"] = {k: f"<{n} characters>" for k, n in sizes.items() if k in (cm.get("data") or {})}
    if cm.get("binaryData"):
        cm["binaryData"] = {k: f"<{n} base64 characters>" for k, n in sizes.items() if k in cm["binaryData"]}
    return objects, list(plan.notes)


def dry_run(spec: ClusterSpec, *, backend: Plugin, job: JobSpec | None = None,
            launcher: KubernetesLauncher | None = None) -> JsonObject:
    """Resources under Pulumi mocks, the Kubernetes manifests, the plan notes and the estimate (+ text);
    `backend`: gcp's plugin (given by `plugin.dry_run`: this module does not import the plugin back)."""
    from gpucluster.costing import cost

    notes = []
    if not spec.project:
        spec = spec.replace(project=PLACEHOLDER_PROJECT)
        notes.append(f"no GCP project resolved here: shown as {PLACEHOLDER_PROJECT} (pass --project)")
    mocks, outputs = _declare(spec)
    resources = [_summary(r) for r in mocks.resources]
    manifests, plan_notes = _manifests(outputs, job, launcher) if job is not None else ([], [])
    from .catalog import idle_minutes

    idle = []
    minutes = idle_minutes(spec)
    if minutes:  # installed through the Kubernetes API once the stack is up (infra/gcp/idle.py)
        from .idle import manifests as idle_manifests, namespace_of

        ns = namespace_of(spec.options)
        made = idle_manifests(cluster=spec.name, namespace=ns, minutes=minutes, nodes=spec.nodes, deadline=0, now=0)
        idle = [{"kind": obj.kind, "namespace": ns, "name": obj.metadata.name} for obj in made.values()]

    est = cost.estimate(spec, 1, backend=backend)
    result = {"dry_run": True, "project": spec.project, "project_source": spec.project_source,
              "resources": resources, "manifests": manifests, "plan": plan_notes, "notes": notes, "idle_stop": idle,
              "estimate": est.to_dict(), "estimate_line": est.render_line()}
    result["text"] = render(result, est)
    return result


def _manifest_line(m: JsonMapping) -> str:
    """One Kubernetes object the launcher applies: kind, namespace/name and what it is."""
    meta, spec = m["metadata"], m.get("spec") or {}
    desc = ""
    if m["kind"] == "ConfigMap":
        desc = f"{len(m.get('data') or {}) + len(m.get('binaryData') or {})} files mounted at /gpucluster"
    elif m["kind"] == "Service":
        desc = f"headless (clusterIP {spec.get('clusterIP')}), port {spec['ports'][0]['port']}"
    elif m["kind"] == "Job":
        pod = spec["template"]["spec"]
        desc = (f"Indexed, completions {spec['completions']}, backoffLimitPerIndex {spec.get('backoffLimitPerIndex')}, "
                f"activeDeadlineSeconds {spec.get('activeDeadlineSeconds')}, image "
                f"{pod['containers'][0]['image']}, GPUs/pod "
                f"{(pod['containers'][0].get('resources') or {}).get('limits', {}).get('nvidia.com/gpu', 0)}, "
                f"init container {pod.get('initContainers', [{}])[0].get('name')}")
    return f"  {m['kind']:<10} {meta['namespace']}/{meta['name']}  {desc}"


def _resource_lines(resources: list[JsonObject]) -> list[str]:
    lines = [f"Pulumi resources ({len(resources)}):"]
    for r in resources:
        extra = {k: v for k, v in r.items() if k not in ("type", "name", "labels") and v not in (None, [], {})}
        lines.append(f"  {r['type']:<34} {r['name']}")
        if extra:
            lines.append("      " + ", ".join(f"{k}={v}" for k, v in extra.items()))
    return lines


def _estimate_lines(result: JsonMapping, est: Estimate) -> list[str]:
    lines = ["estimate: " + result["estimate_line"]]
    lines += [f"  {ln['category']:<12} {ln['description']:<46} ${Decimal_str(ln['hourly'])}/h" for ln in est.lines]
    lines += [f"  note: {n}" for n in est.notes]
    return lines


def render(result: JsonMapping, est: Estimate) -> str:
    lines = ["dry run: nothing created, no credentials used (the Pulumi program ran under Pulumi's mock runtime)"]
    lines += [f"note: {n}" for n in result["notes"]]
    src = f" (from {result['project_source']})" if result.get("project_source") else ""
    lines.append(f"project: {result['project']}{src}")
    lines += _resource_lines(result["resources"])
    if result["manifests"]:
        lines.append("Kubernetes objects the launcher applies (and deletes at the end):")
        lines += [_manifest_line(m) for m in result["manifests"]]
    lines += [f"  {n}" for n in result["plan"]]
    if result.get("idle_stop"):
        lines.append("Kubernetes objects installed after the stack is up (the idle stop; they go with the cluster):")
        lines += [f"  {o['kind']:<14} {o['namespace']}/{o['name']}" for o in result["idle_stop"]]
    lines += _estimate_lines(result, est)
    return "\n".join(lines)


def Decimal_str(value: object) -> str:  # noqa: N802 - a tiny formatter
    from decimal import ROUND_HALF_UP, Decimal

    return str(Decimal(str(value)).quantize(Decimal("0.0001"), ROUND_HALF_UP))
