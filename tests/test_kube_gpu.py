"""`--gpu TYPE[:COUNT]` on `--cloud kubernetes` (issue 44): COUNT GPUs per pod, on the nodes whose GPU feature
discovery label names TYPE, against the FAKE API server run as "someone else's cluster" (tests/test_kube_backend.py)
with its pods placed by the fake scheduler (tests/k8s_fake_cluster.py `schedule`, tests/k8s_fake_sched.py).

What the fake's nodes carry, and why:
- `nvidia.com/gpu.product` is the GPU's NVML name with blanks made `-` (NVIDIA-L4, NVIDIA-A100-SXM4-80GB,
  NVIDIA-H100-80GB-HBM3, NVIDIA-H100-PCIe), set by NVIDIA GPU feature discovery: its "Generated Labels"
  (https://github.com/NVIDIA/k8s-device-plugin#gpu-feature-discovery, docs/gpu-feature-discovery/README.md) and
  internal/lm/resource.go `getProductName`/`sanitise` of NVIDIA/k8s-device-plugin. A node where GPU feature
  discovery does not run has no such label.
- The scheduler places a pod only on a node matching its nodeSelector and required node affinity, and not on a
  node of a pod its anti-affinity names (Kubernetes docs, "Assigning Pods to Nodes",
  https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/): tests/k8s_fake_sched.py.

Every refusal: one line, exit 2, no traceback, nothing created in the cluster (no object, no create call) and
nothing recorded."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("kubernetes")
import yaml  # noqa: E402

from k8s_fake_cluster import node, schedule  # noqa: E402
from test_kube_backend import TEAM_NS, _cli, cluster, gpucluster  # noqa: E402,F401 - the fixture

pytestmark = pytest.mark.integration

PRODUCT = "nvidia.com/gpu.product"
SAY = ("--", "python", "-c", "print(1)")


def gpu_node(name, gpus, product=None, **kw):
    return node(name, gpus, labels={PRODUCT: product} if product else {}, **kw)


MIXED = [gpu_node("a100-0", 8, "NVIDIA-A100-SXM4-80GB"), gpu_node("a100-1", 8, "NVIDIA-A100-SXM4-80GB"),
         gpu_node("l4-0", 1, "NVIDIA-L4"), gpu_node("l4-1", 1, "NVIDIA-L4"), gpu_node("l4-2", 1, "NVIDIA-L4")]


def refused(capsys, c, *args):
    code, out, err = gpucluster(capsys, *args)
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2, (code, out[-2000:], err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("gpucluster: error: "), err
    assert "Traceback" not in out + err
    assert c.created() == [] and set(c.fake.objects) == c.before, c.created()  # nothing made in the cluster
    from gpucluster.ledger.store import Ledger

    assert Ledger.open_default().list_runs() == []  # nor recorded
    return lines[0]


def placed(c):
    """{pod: node} of the run's pods, as the fake scheduler bound them."""
    return {pod: n.name for pod, (n, _) in c.fake.scheduler.bound.items() if pod.startswith("gpucluster-")}


def test_gpu_l4_lands_only_on_l4_nodes(cluster, capsys):
    c = cluster(nodes=MIXED)
    schedule(c.fake)
    code, out, err = gpucluster(capsys, "--gpu", "L4:1", *SAY)
    assert code == 0, (out + err)[-3000:]
    said = " ".join((out + err).split())
    assert "1 L4 nvidia.com/gpu/pod" in said, said[-3000:]
    assert f"checked before creating: GPU L4: nodes labelled {PRODUCT} NVIDIA-L4" in said, said[-3000:]
    (job,) = c.jobs
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {PRODUCT: "NVIDIA-L4"} and "nodeAffinity" not in pod["affinity"], pod
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    where = placed(c)
    assert len(where) == 2 and set(where.values()) <= {"l4-0", "l4-1", "l4-2"}, where
    assert len(set(where.values())) == 2, where  # one pod a node (their anti-affinity)


def test_several_product_values_of_one_gpu_are_selected_by_node_affinity(cluster, capsys):
    """H100 nodes of two kinds (SXM HBM3 and PCIe): the pods may use either, through a required node affinity
    `In` both values; the A100 nodes listed first (where a first fit would put them) stay free."""
    c = cluster(nodes=[gpu_node("a100-0", 8, "NVIDIA-A100-SXM4-80GB"), gpu_node("h100-sxm", 8, "NVIDIA-H100-80GB-HBM3"),
                       gpu_node("h100-pcie", 2, "NVIDIA-H100-PCIe"), gpu_node("l4-0", 2, "NVIDIA-L4")])
    schedule(c.fake)
    code, out, err = gpucluster(capsys, "--gpu", "h100:2", *SAY)
    assert code == 0, (out + err)[-3000:]
    (job,) = c.jobs
    pod = job["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod or PRODUCT not in (pod["nodeSelector"] or {}), pod
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": PRODUCT, "operator": "In",
                                            "values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe"]}]}], terms
    assert sorted(placed(c).values()) == ["h100-pcie", "h100-sxm"], placed(c)


def test_each_refusal_is_one_line_and_creates_nothing(cluster, capsys):
    c = cluster(nodes=MIXED)
    line = refused(capsys, c, "--gpu", "H100")
    assert f"no node has GPU H100: the cluster's nodes carry {PRODUCT} NVIDIA-A100-SXM4-80GB (2 nodes), " \
           "NVIDIA-L4 (3 nodes); ask for a GPU they have with --gpu" in line, line
    line = refused(capsys, c, "--gpu", "A100")  # the catalog's A100 is the 40 GB one
    assert "no node has GPU A100:" in line, line
    line = refused(capsys, c, "--gpu", "L4:2")
    assert "2 nodes × 2 L4 GPUs requested; the largest node with GPU L4 has 1 allocatable nvidia.com/gpu" in line, line
    line = refused(capsys, c, "--gpu", "L4", "--nodes", "4")
    assert "4 nodes × 1 L4 GPU requested; the largest node with GPU L4 has 1 allocatable nvidia.com/gpu and 3 " \
           "node(s) have 1" in line, line
    line = refused(capsys, c, "--gpu", "L4:1", "--gpus-per-node", "2")
    assert "--gpu L4:1 asks for 1 GPU(s) per node but --gpus-per-node is 2" in line, line
    line = refused(capsys, c, "--gpu", "L4", "--option", f"node-selector={PRODUCT}=NVIDIA-A100-SXM4-80GB")
    assert f"--gpu L4 and --option node-selector={PRODUCT}=NVIDIA-A100-SXM4-80GB name different GPUs" in line, line
    line = refused(capsys, c, "--gpu", "A100", "--option", "gpu-product=NVIDIA-A100-SXM4-80GB")
    assert "--gpu A100 and --option gpu-product=NVIDIA-A100-SXM4-80GB name different GPUs" in line, line
    line = refused(capsys, c, "--gpu", "L4", "--option", "gpu-resource=amd.com/gpu")
    assert "--option gpu-resource=amd.com/gpu is not an NVIDIA resource" in line, line
    line = refused(capsys, c, "--gpu", "X9")
    assert "gpu 'X9' is not known" in line, line


def test_nodes_without_the_gpu_label_are_said_with_the_way_out(cluster, capsys):
    c = cluster(nodes=[gpu_node("gpu-a", 4), gpu_node("gpu-b", 4)])  # GPU feature discovery not installed
    line = refused(capsys, c, "--gpu", "L4")
    assert f"no node offering nvidia.com/gpu has the label {PRODUCT} (2 node(s) without it: NVIDIA GPU feature " \
           "discovery is not installed): choose the nodes with --option node-selector=KEY=VALUE" in line, line
    c = cluster(nodes=[gpu_node("gpu-a", 4), gpu_node("a100-0", 8, "NVIDIA-A100-SXM4-80GB")])
    line = refused(capsys, c, "--gpu", "L4")
    assert "no node has GPU L4: the cluster's nodes carry nvidia.com/gpu.product NVIDIA-A100-SXM4-80GB (1 node); 1 " \
           "node(s) lack the label" in line and "--option node-selector" in line, line


def test_a_dry_run_shows_the_rules_selector_and_says_the_labels_were_not_checked(cluster, capsys):
    c = cluster(nodes=MIXED)
    calls = len(c.fake.calls)
    for gpu, want in (("L4:1", {"nodeSelector": {PRODUCT: "NVIDIA-L4"}}),
                      ("H100:8", {"values": ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-PCIe", "NVIDIA-H100-NVL"]})):
        code, out, err = gpucluster(capsys, "--dry-run", "--gpu", gpu, *SAY)
        assert code == 0, (out + err)[-3000:]
        text = out + err
        (job,) = [d for d in yaml.safe_load_all(text[text.index("apiVersion"):text.index("not checked")])
                  if d["kind"] == "Job"]
        pod = job["spec"]["template"]["spec"]
        if "nodeSelector" in want:
            assert pod["nodeSelector"] == want["nodeSelector"], pod
        else:
            (term,) = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            assert term["matchExpressions"] == [{"key": PRODUCT, "operator": "In", "values": want["values"]}], term
        said = " ".join(text[text.index("not checked"):].split())
        name = gpu.split(":")[0]
        assert f"- the GPU labels: which nodes carry GPU {name} ({PRODUCT}); the selector above is the rule's" in said, said
    assert len(c.fake.calls) == calls and c.fake.reviews == []  # the cluster was not reached


def test_a_task_files_gpu_key_is_the_flag(cluster, capsys, tmp_path):
    c = cluster(nodes=MIXED)
    task = tmp_path / "task.yaml"
    task.write_text("resources:\n  cloud: kubernetes\n  nodes: 2\n  gpu: L4:1\nrun: python -c 'print(1)'\n")
    from gpucluster.cli.main import main

    code = main(["run", str(task), "--dry-run"])
    text = capsys.readouterr().out
    assert code == 0 and f"{PRODUCT}: NVIDIA-L4" in text, text[-3000:]
    assert c.fake.reviews == []


def test_a_kept_namespace_keeps_its_gpu_and_its_internal_price(cluster, capsys):
    """`up --gpu L4:1` keeps the GPU with the cluster: each `exec` job selects the L4 nodes again (read anew);
    `status` shows the internal price the user gave (issue 44, item 4): what the kept cluster's runs held."""
    c = cluster(nodes=MIXED)
    schedule(c.fake)
    code, text, _ = _cli(capsys, "up", "--cloud", "kubernetes", "--name", "lab", "--nodes", "2", "--gpu", "L4:1",
                         "--option", "price-per-gpu-hour=2.5", "--yes")
    assert code == 0, text[-3000:]
    said = " ".join(text.split())
    assert "a namespace of an existing Kubernetes cluster, internal price $5.00/hour while it runs a job, rented by " \
           "nobody; jobs: gpucluster exec lab -- ...; gpucluster down lab removes what gpucluster put there, never " \
           "the namespace, the cluster or its nodes" in said, said
    code, text, _ = _cli(capsys, "exec", "lab", *SAY)
    assert code == 0, text[-3000:]
    assert "cluster lab stays kept (a namespace of an existing Kubernetes cluster, internal price $5.00/hour while " \
           "it runs a job" in " ".join(text.split()), text[-3000:]
    (job,) = c.jobs
    assert job["spec"]["template"]["spec"]["nodeSelector"] == {PRODUCT: "NVIDIA-L4"}
    assert set(placed(c).values()) <= {"l4-0", "l4-1", "l4-2"}, placed(c)
    from gpucluster.cli.status import cluster_rows
    from gpucluster.ledger.store import Ledger

    code, text, _ = _cli(capsys, "exec", "lab", *SAY)
    assert code == 0, text[-3000:]
    ledger = Ledger.open_default()
    runs = sorted((ledger.get_run(r.id).run for r in ledger.list_runs()), key=lambda r: r.created_at)
    up, jobs = runs[0], runs[1:]
    assert up.command == ["gpucluster", "up"] and len(jobs) == 2 and all(j.command[0] == "python" for j in jobs), runs
    from decimal import Decimal

    # $2.5 per GPU-hour × 2 GPUs (2 pods × 1), for the seconds each job held them (to 4 places); the `up` held none
    want = sum((Decimal("2.5") * 2 * Decimal(str(j.ended_at - j.created_at)) / 3600).quantize(Decimal("0.0001"))
               for j in jobs)
    assert want >= Decimal("0.0010"), want  # each job takes over a second here: not a rounding's zero
    (row,) = cluster_rows(ledger, observe=False)
    assert row["cluster"] == "lab" and Decimal(row["accrued_usd"]) == want, (row, want)
    code, text, stdout = _cli(capsys, "status", "--json")
    (lab,) = [r for r in json.loads(stdout) if r["cluster"] == "lab"]
    assert lab["state"] == "kept" and Decimal(lab["accrued_usd"]) == want, lab
