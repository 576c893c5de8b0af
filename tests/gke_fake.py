"""FAKE GKE behind the fake Pulumi CLI (tests/pulumi_fake.py), for runs that provision, lose a node,
tear down and provision again (tests/test_recovery_gcp.py, benchmarks/recovery.py). NOT Google.

The real Automation API driver runs the fake CLI; as its `up` starts the REAL gcp program
(`infra.program.run`, the component in infra/gcp/component.py) is run under Pulumi's mock runtime for
the spec the driver was given (`infra.gcp.dryrun._declare`): the engine events report the resources
it declares with their inputs (so the ledger's rows and the cost come from the machine type, the
GPUs and the spot setting the program asked for), and its outputs become the stack's, with the
cluster's endpoint the API server of a NEW in-memory cluster (tests/k8s_fake.py, served over HTTP by
tests/k8s_fake_http.py, whose pods run the launcher's real programs as processes). How it behaves,
and the public source for it:

- Every `up` after a `destroy` makes a new cluster: a new control plane at a new endpoint, with none of
  the old one's objects or pods (GKE docs, "Deleting a cluster": deleting a cluster deletes its control
  plane, its nodes and the workloads on them). Here: a new FakeKubeApi on a new port each time; the
  kubeconfig in the stack's outputs names it. The launcher reaches it as production does, from that
  kubeconfig with a bearer token from Google credentials (`infra.gcp.gke.api_from_gke`; a fake google-auth
  credential mints the token). The one difference: plain HTTP, no cluster CA.
- `destroy` deletes the cluster: its pods' processes are killed, its API server stops answering
  (connection refused), and the tag scan (`find`) no longer reports it; until then the scan reports
  the cluster, owned by this home (as the real scan of GKE clusters by their labels does).
- Creation takes minutes: a GKE cluster "Creation complete after 8m49s" and 10m30s in
  GoogleCloudPlatform/cluster-toolkit PR #4215; a GPU node with its driver installed about 9 minutes
  more (codalab-worksheets#4042; /work/shared/reference/FACTS.md). `cluster_s` and `pool_s` are the
  fake CLI's create steps of the cluster and of its GPU pool (the system pool is made beside the GPU
  pool, in parallel, and takes no extra time here); 0 (the default): at once. Deletion is at once
  here (GKE takes minutes; `pulumi destroy` waits for it).
- With `iam` (a tests/google_fake.FakeProject), the program's Google service accounts are created in
  that project's IAM as `up` reaches them and deleted by `destroy`. An account id already taken there
  fails the update at that resource as pulumi-gcp reports IAM's 409 ALREADY_EXISTS ("Error creating
  service account: googleapi: Error 409: ..., alreadyExists": the provider returns the create's error
  as is unless `create_ignore_already_exists` is set, terraform-provider-google
  resource_google_service_account.go; pulumi-gcp 10.2's `serviceaccount.Account` takes the same flag
  and the program does not set it); the resources before it were created, as the engine's are.
"""

from __future__ import annotations

import json
import threading
from typing import Any

from k8s_fake import FakeKubeApi, PodScript
from k8s_fake_http import serve_http

TOKEN = "ya29.fake-gke-token"  # what the fake credentials mint and every fake cluster accepts


class FakeGoogleCredentials:
    """FAKE google-auth credentials: always the same valid token (the API servers accept it)."""

    def __init__(self) -> None:
        self.token, self.valid = TOKEN, True

    def refresh(self, request: Any) -> None:
        self.token, self.valid = TOKEN, True


def gpu_pool_scheduler(outputs: dict) -> Any:
    """A scheduler over the GPU pool's nodes (tests/k8s_fake_sched.py: MemTotal capacity, GKE's
    reservations, its DaemonSets already there), labelled as GKE labels them; None for a machine type
    the catalog does not know."""
    from k8s_fake_sched import Scheduler, gke_node

    from gpucluster.infra.gcp.catalog import machine_shape
    from gpucluster.infra.gcp.gke import node_selector

    shape = machine_shape(str(outputs.get("machine_type") or ""))
    if shape is None:
        return None
    labels = node_selector(outputs)
    return Scheduler([gke_node(f"gke-gpu-{i}", shape[0], float(shape[1]), int(outputs.get("gpus_per_node") or 1),
                               labels) for i in range(int(outputs.get("nodes") or 1))])


class GkeLike:
    """Clusters made and deleted by the fake CLI's `up` and `destroy` (see the module docstring).
    `scripts()`: the pods' scripts of each new cluster (default: the job's own program on every node)."""

    def __init__(self, nodes: int = 2, scripts: Any = None, cluster_s: float = 0.0, pool_s: float = 0.0,
                 delete_ticks: int = 2, iam: Any = None):
        self.nodes = nodes
        self.iam = iam  # the project's IAM (google_fake.FakeProject): where the program's accounts are made
        self.scripts = scripts or (lambda: {r: PodScript(program=True) for r in range(nodes)})
        self.cluster_s, self.pool_s = cluster_s, pool_s
        self.delete_ticks = delete_ticks
        self.clusters: list[FakeKubeApi] = []  # every cluster made, in order
        self.current: FakeKubeApi | None = None
        self.urls: list[str] = []
        self._stop: Any = None
        self.spec: Any = None  # the spec the driver was given (set by `provider`)
        self.outputs: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.fake: Any = None
        self.accounts: list[str] = []  # emails of the accounts the program made in `iam`

    # -- the fake CLI's hooks ----------------------------------------------------------------------
    def before_up(self, stack: str) -> None:
        """The real program declares the stack for the spec: the fake CLI reports its resources with
        their inputs (what the ledger records and the cost is computed from)."""
        from gpucluster.infra.gcp import dryrun

        mocks, self.outputs = dryrun._declare(self.spec)
        made = [r for r in mocks.resources if r.typ.startswith("gcp:")]
        self.fake.resources = [(r.typ, r.name, f"projects/my-proj-42/{r.name}") for r in made]
        self.fake.inputs.update({r.name: dict(r.inputs) for r in made})
        if self.iam is not None:
            self._create_accounts(made)

    ACCOUNT = "gcp:serviceaccount/account:Account"

    def _create_accounts(self, made: list) -> None:
        """The program's service accounts, made in IAM in the order the update reaches them; the first
        whose id is taken fails the update there (see the module docstring)."""
        self.fake.fail_up_after, self.fake.fail_text = None, ""
        for i, r in enumerate(made):
            if r.typ != self.ACCOUNT:
                continue
            try:
                self.iam.create_account(r.inputs["accountId"], r.inputs.get("displayName", ""),
                                        r.inputs.get("description", ""))
            except Exception as exc:  # noqa: BLE001 - the fake's api_error: 409 ALREADY_EXISTS
                self.fake.fail_up_after = i
                self.fake.fail_text = (f"error: Error creating service account: googleapi: Error {exc.status}: "
                                       f"{exc.message}, alreadyExists")
                return
            self.accounts.append(f"{r.inputs['accountId']}@{self.iam.project}.iam.gserviceaccount.com")

    def on_up(self, stack: str) -> None:
        outputs = dict(self.outputs)  # the real program's outputs for this spec
        fake = FakeKubeApi(self.scripts(), delete_ticks=self.delete_ticks)
        fake.scheduler = gpu_pool_scheduler(outputs)  # the pool's nodes as the kubelet reports them
        url, stop = serve_http(fake, TOKEN)
        config = json.loads(outputs["kubeconfig"])
        config["clusters"][0]["cluster"] = {"server": url}  # plain HTTP: no CA
        outputs.update(kubeconfig=json.dumps(config), endpoint=url.split("//", 1)[1])
        with self.lock:
            self.clusters.append(fake)
            self.urls.append(url)
            self.current, self._stop = fake, stop
        self.fake.scripted_outputs = outputs

    def on_destroy(self, stack: str) -> None:
        """The cluster is deleted with its nodes: every pod's processes die, the API goes away; the
        accounts the program made are deleted."""
        from gpucluster.infra.gcp.leftovers import IAM

        while self.iam is not None and self.accounts:
            self.iam.delete(f"{IAM}/projects/-/serviceAccounts/{self.accounts.pop()}")
        with self.lock:
            fake, stop, self.current, self._stop = self.current, self._stop, None, None
        if fake is None:
            return
        stop()
        for pod in list(fake.pods.values()):
            pod.kill()
        fake.pods.clear()
        fake.objects.clear()

    def find(self, cloud: str, name: str | None = None, run_id: str | None = None, **kw: Any) -> list:
        """The tag scan: the cluster while it exists (ours: this home's owner mark)."""
        from gpucluster.domain import Leftover
        from gpucluster.ownership import installation_id

        if self.current is None:
            return []
        return [Leftover("gke-cluster", f"projects/p/locations/z/clusters/{name}", "us-central1-a",
                         detail="RUNNING", owner=installation_id())]

    def stop(self) -> None:
        self.on_destroy("")

    # -- the provider ------------------------------------------------------------------------------
    def provider(self, name: str, provider_kw: dict[str, Any] | None = None, **fake_kw: Any) -> tuple[Any, Any]:
        """(the gcp PulumiProvider on the real driver and this fake CLI, the fake CLI). `provider_kw`:
        more of PulumiProvider's arguments (a stand-in account's credential and cloud checks)."""
        from pulumi_fake import FakePulumiCommand

        from gpucluster.infra.pulumi.engine import PulumiDriver
        from gpucluster.infra.pulumi.provider import PulumiProvider
        from gpucluster.infra.registry import plugin

        gke = self

        class Driver(PulumiDriver):
            def up(self, spec: Any, events: Any = None) -> Any:
                gke.spec = spec
                return super().up(spec, events)

        delays = {f"{name}-cluster": self.cluster_s, f"{name}-gpu": self.pool_s}
        self.fake = FakePulumiCommand(resources=[], outputs={}, secret_keys=("kubeconfig",), before_up=self.before_up,
                                      on_up=self.on_up, on_destroy=self.on_destroy, create_delays=delays, **fake_kw)
        kw = {"find": self.find, "delete": lambda items: [], **(provider_kw or {})}  # a test may scan for real
        provider = PulumiProvider(plugin("gcp"), driver=Driver(pulumi_command=self.fake, program_runner=lambda s: None),
                                  **kw)
        return provider, self.fake

    def launcher(self, poll_interval: float = 2.0, api_retry_s: float = 10.0) -> Any:
        """The Kubernetes launcher as `gpucluster run --cloud gcp` makes it, reaching each new cluster
        from its stack's kubeconfig with the fake Google credentials."""
        from gpucluster.infra.gcp.gke import GKE
        from gpucluster.infra.kubernetes.launcher import KubernetesLauncher

        return KubernetesLauncher(credentials=FakeGoogleCredentials(), poll_interval=poll_interval,
                                  api_retry_s=api_retry_s, platform=GKE)
