"""`--data` and `--resume` on Kubernetes: each pod's folders staged through the Kubernetes exec API while
the pod runs (its argv waits for `plan.STAGED_FILE` before setup and torchrun).

A pod exists only once the Job does, so staging is not a step before the launch (as over ssh) but
part of the run: `PodStager` is the `stage` of `gpucluster.watch.supervisor.NodeSupervisor.run`. Asked
every loop (`poll`), it starts one thread for each pod whose container is running; the run's phase
is `stage` until every pod is staged. For one pod:

1. local folders (`--data DIR`, `--resume`) go through the same content-addressed cache program
   as over ssh (`gpucluster.watch.staging.STAGE_PY`), here with the cache on the GPU node's own disk (a
   hostPath volume at `plan.CACHE_MOUNT`): the pod answers which sha256 it lacks, a tar of only
   those files goes to its stdin, and it lays each folder out at `RUN_DIR/DEST` (beside a shipped
   script, `RUN_DIR/code/DEST`: `plan.staged_rel`) (copies: a hard
   link cannot cross from one volume mount to another). Stdin is never closed: the program reads
   a line, then a tar that ends with its own end-of-archive blocks (the exec API's v4 websocket
   protocol has no way to close stdin, kubernetes/kubernetes#89899).
2. object-storage sources (`--data gs://...`) are pulled by the pod itself with its own
   credentials (`launcher.objects`, the backend's node transfer program, run by `sh -c`).
3. `--resume` with a shipped script (`lay_back`): once the entry script has laid the script's folder
   down and made its mark, the resumed run's working-folder files (staged under resume/) are copied
   into the pod's working folder (`gpucluster/node/workdir.py --lay-back`, as over ssh), with a
   `resume_files` record.
4. the staged file is made; the pod's wrapper goes on.

One `stage` metric record per pod (files, bytes, sent_bytes, sent_files, seconds, what the cache
program answered, fetched_bytes for object storage), emitted from `poll` on the supervisor's
thread. A failure names the node and its pod; `cancel` closes every exec stream in flight (the run
is being stopped).
"""

from __future__ import annotations

import json
import tarfile
import threading
import time
from typing import TYPE_CHECKING, Callable, Sequence

from gpucluster.errors import LaunchError
from gpucluster.events import Phase
from gpucluster.watch.launch import JobSpec
from gpucluster.watch.staging import STAGE_KIND, DataMount, manifest, staged_mounts

from .api import KubeApi, _is_api_error, _status
from .manifests import kube_models
from .outputs import TOUCH, _exec, _ExecReader
from .platform import ObjectTransfer
from .plan import CACHE_MOUNT, CODE_DIR, MOUNT, RUN_DIR, SHIPPED_MARK, STAGED_FILE, Plan, staged_rel

if TYPE_CHECKING:
    from gpucluster.events import RunEvents
    from gpucluster.states import JsonObject

    from .api import KubeObject
    from .pods import _Pods

LAY_BACK_WAIT_S = 600  # --resume: how long the lay-back waits for the entry script to lay the working folder down

CHUNK = 1 << 20  # bytes per stdin frame


class _Stdin:
    """A write-only file object over an exec's stdin: 1 MiB frames, counting the bytes sent."""

    def __init__(self, client: KubeObject):
        self.client, self.count, self.buf = client, 0, bytearray()

    def write(self, data: bytes) -> int:
        self.buf += data
        while len(self.buf) >= CHUNK:
            self._send(bytes(self.buf[:CHUNK]))
            del self.buf[:CHUNK]
        return len(data)

    def flush(self) -> None:
        if self.buf:
            self._send(bytes(self.buf))
            self.buf = bytearray()

    def _send(self, data: bytes) -> None:
        if not self.client.is_open():
            raise OSError("the exec stream closed while sending")
        self.client.write_stdin(data)
        self.count += len(data)


def _last(err: bytes, rc: int | None) -> str:
    lines = [ln.strip() for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1][-400:] if lines else f"exit code {rc}"


def _answer(out: bytes) -> JsonObject | list[object]:
    lines = [ln for ln in out.decode("utf-8", "replace").splitlines() if ln.strip()]
    try:
        got = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        got = None
    return got if isinstance(got, (dict, list)) else {}


class PodStager:
    """Stages `mounts` into every pod of `plan` as it starts running (see the module docstring)."""

    phase = Phase.STAGE  # the phase the supervisor reports while it runs

    def __init__(self, api: KubeApi, plan: Plan, pods: _Pods, mounts: Sequence[DataMount],
                 objects: ObjectTransfer | None = None, python: str = "python",
                 lay_back: tuple[str, Callable[[int, int], JsonObject]] | None = None):
        self.api, self.plan, self.pods, self.objects, self.python = api, plan, pods, objects, python
        # --resume: (the folder in the pod whose files go back into CODE_DIR, record(files, bytes) -> metric)
        self.lay_back = lay_back
        self.laid: dict[int, JsonObject] = {}
        self.mounts = list(mounts)
        self.local = [m for m in self.mounts if not m.remote]
        self.files = [manifest(m.src) for m in self.local]  # hashed once, here, before any pod exists
        self.by_hash: dict[str, tuple[str, int]] = {}
        for m, fs in zip(self.local, self.files):
            for f in fs:
                self.by_hash.setdefault(f["sha256"], (f"{m.src}/{f['path']}", f["size"]))
        if any(m.remote for m in self.mounts) and objects is None:
            raise LaunchError("this backend's pods cannot read object storage (no --data URL is allowed here)")
        self.started: dict[int, threading.Thread] = {}
        self.records: dict[int, JsonObject] = {}
        self.errors: dict[int, str] = {}
        self.emitted: set[int] = set()
        self.events: RunEvents | None = None
        self._clients: set[KubeObject] = set()
        self._lock = threading.Lock()
        self._cancelled = False

    @property
    def done(self) -> bool:
        return len(self.emitted) == self.plan.nodes

    def poll(self) -> str | None:
        """Start staging every newly running pod; emit finished records; the first failure, if any."""
        for rank in sorted(self.pods.attached):
            name = self.pods.pod_names.get(rank)
            if rank not in self.started and name and not self._cancelled:
                t = threading.Thread(target=self._one, args=(rank, name), name=f"stage-node-{rank}", daemon=True)
                self.started[rank] = t
                t.start()
        with self._lock:
            ready = {r: rec for r, rec in self.records.items() if r not in self.emitted}
            errors = dict(self.errors)
        for rank in sorted(ready):
            self.emitted.add(rank)
            if self.events is not None:
                self.events.on_metric(rank, ready[rank])
                if rank in self.laid:
                    self.events.on_metric(rank, self.laid[rank])
        if errors:
            return "; ".join(errors[r] for r in sorted(errors))
        return None

    def cancel(self, wait_s: float = 10.0) -> None:
        """Close every exec stream in flight and wait (bounded) for the staging threads."""
        self._cancelled = True
        with self._lock:
            clients = list(self._clients)
        for c in clients:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing what may already be closed
                pass
        end = time.monotonic() + wait_s
        for t in self.started.values():
            t.join(max(0.0, end - time.monotonic()))

    # -- one pod -----------------------------------------------------------------------------
    def _one(self, rank: int, pod: str) -> None:
        who = f"node {rank} (pod {pod})"
        try:
            rec = self._stage(pod)
            laid = self._lay_back(pod) if self.lay_back is not None else None
            start = time.monotonic()
            rc, _, err, _ = self._run(pod, [self.python, "-c", TOUCH, STAGED_FILE])  # the job may start
            if rc != 0:
                raise LaunchError(f"cannot start the pod's job after staging: {_last(err, rc)}")
            rec["seconds"] = round(rec["seconds"] + time.monotonic() - start, 3)
        except Exception as exc:  # noqa: BLE001 - reported by node
            why = str(exc) if isinstance(exc, (LaunchError, OSError)) else f"{type(exc).__name__}: {exc}"
            with self._lock:
                self.errors[rank] = f"{who}: staging the data failed: {why}"
            return
        with self._lock:
            if laid is not None:
                self.laid[rank] = laid
            self.records[rank] = rec

    def _run(self, pod: str, command: list[str], payload: Callable[[_Stdin], object] | None = None
             ) -> tuple[int | None, bytes, bytes, int]:
        """(exit code, stdout, stderr, bytes sent) of `command` in the pod; `payload(stdin)` writes its input."""
        if self._cancelled:
            raise LaunchError("the run is being stopped")
        client = _exec(self.api, self.plan, pod, command, stdin=payload is not None)
        with self._lock:
            self._clients.add(client)
        try:
            sent = 0
            if payload is not None:
                sink = _Stdin(client)
                payload(sink)
                sink.flush()
                sent = sink.count
            reader = _ExecReader(client)
            out = reader.read()
            if self._cancelled:
                raise LaunchError("the run is being stopped")
            return reader.returncode(), out, bytes(reader.stderr), sent
        finally:
            with self._lock:
                self._clients.discard(client)
            client.close()

    def _stage(self, pod: str) -> JsonObject:
        from gpucluster.watch.staging import STAGE_PY

        start = time.monotonic()
        rec: JsonObject = {"kind": STAGE_KIND, "files": sum(len(fs) for fs in self.files),
                               "bytes": sum(f["size"] for fs in self.files for f in fs), "sent_bytes": 0,
                               "sent_files": 0}
        if self.local:
            want = (json.dumps(sorted([h, s] for h, (_, s) in self.by_hash.items())) + "\n").encode()
            rc, out, err, sent = self._run(pod, [self.python, "-c", STAGE_PY, "check", CACHE_MOUNT],
                                           lambda sink: sink.write(want))
            if rc != 0:
                raise LaunchError(f"checking the node's data cache failed: {_last(err, rc)}")
            missing = _answer(out)
            if not isinstance(missing, list):
                raise LaunchError("checking the node's data cache gave no answer")
            layout = {"tar": bool(missing),
                      "mounts": [{"dest": staged_rel(m.dest, self.plan.code), "files": fs}
                                 for m, fs in zip(self.local, self.files)]}

            def send(sink: _Stdin) -> None:
                sink.write(json.dumps(layout).encode() + b"\n")
                if missing:
                    # typeshed wants a readable, seekable file for every mode; the stream mode w| only writes
                    with tarfile.open(fileobj=sink, mode="w|") as tar:  # type: ignore[call-overload]
                        for h in map(str, missing):  # the hashes the node lacks (JSON strings)
                            path, size = self.by_hash[h]
                            info = tarfile.TarInfo(h)
                            info.size = size
                            with open(path, "rb") as f:
                                tar.addfile(info, f)

            rc, out, err, placed = self._run(pod, [self.python, "-c", STAGE_PY, "place", CACHE_MOUNT, RUN_DIR], send)
            if rc != 0:
                raise LaunchError(f"placing the data failed: {_last(err, rc)}")
            got = _answer(out)
            rec.update(sent_bytes=sent + placed, sent_files=len(missing),
                       **{k: got.get(k) for k in ("received", "linked", "copied") if isinstance(got, dict)})
        fetched_files = fetched = 0
        for m in (m for m in self.mounts if m.remote):
            assert self.objects is not None  # __init__ refused remote data without a transfer program
            script = self.objects.script(self.python, "pull", m.src, f"{RUN_DIR}/{staged_rel(m.dest, self.plan.code)}")
            rc, out, err, _ = self._run(pod, ["sh", "-c", script])
            if rc != 0:
                raise LaunchError(f"staging {m.src} failed: {_last(err, rc)}")
            got = _answer(out)
            got = got if isinstance(got, dict) else {}
            fetched_files += int(got.get("files", 0))
            fetched += int(got.get("bytes", 0))
            rec["tool"] = got.get("tool", "?")
        if fetched_files or any(m.remote for m in self.mounts):
            rec.update(files=rec["files"] + fetched_files, bytes=rec["bytes"] + fetched, fetched_bytes=fetched)
        rec["seconds"] = round(time.monotonic() - start, 3)
        return rec

    def _lay_back(self, pod: str) -> JsonObject:
        """--resume: the resumed run's working-folder files (staged under resume/) copied into the pod's
        working folder, as on ssh (gpucluster/node/workdir.py --lay-back). Only once the entry script has laid
        the shipped folder down and made its mark (it runs beside the staging), so the files are the
        job's own (newer than the mark: they come back with this run too); bounded by LAY_BACK_WAIT_S."""
        import shlex

        assert self.lay_back is not None  # asked for only when the run resumes working-folder files
        src, record = self.lay_back
        script = (f"i=0; while [ ! -e {shlex.quote(SHIPPED_MARK)} ]; do i=$((i+1)); "
                  f"if [ $i -gt {int(LAY_BACK_WAIT_S * 5)} ]; then echo 'the working folder was never laid down' >&2; "
                  f"exit 3; fi; sleep 0.2; done\n"
                  f"exec {shlex.quote(self.python)} {MOUNT}/workdir.py {shlex.quote(CODE_DIR)} --lay-back "
                  f"{shlex.quote(src)}")
        rc, out, err, _ = self._run(pod, ["sh", "-c", script])
        got = _answer(out) if rc == 0 else None
        if not isinstance(got, dict) or "files" not in got:
            raise LaunchError(f"laying back the resumed files failed: {_last(err, rc)}")
        return record(int(got["files"]), int(got["bytes"]))


def uses_objects(job: JobSpec) -> bool:
    """Whether the job's pods read or write object storage (`--data`/`--resume` URL, `--output` URL)."""
    return any(m.remote for m in staged_mounts(job)) or "://" in str(job.output_dir or "")


def object_transfer(objects: ObjectTransfer | None, job: JobSpec
                    ) -> tuple[tuple[tuple[str, str, str], ...], ObjectTransfer | None]:
    """(ConfigMap files, node transfer) for a job that uses object storage: the transfer's program
    is shipped in the ConfigMap and run from there (`MOUNT/<name>`), so each exec request carries a
    short command, not the program (it would be tens of KB in the request's URL). Else ((), objects)."""
    if objects is None or not uses_objects(job):
        return (), objects
    name, text = objects.program()
    return ((f"o.{name}", name, text),), objects.at(f"{MOUNT}/{name}")


def ensure_service_account(api: KubeApi, plan: Plan, ksa: str, annotations: dict[str, str]) -> None:
    """The Kubernetes service account the pods run as for object storage, with the annotations that
    bind it to the provider's identity (gcp: `iam.gke.io/gcp-service-account`, GKE Workload Identity:
    `infra.gcp.gke`). It belongs to the cluster, not to one run (the provider's binding names it), so
    it is created once and left for later runs; it bills nothing and goes with the cluster."""
    k = kube_models()
    body = k.V1ServiceAccount(metadata=k.V1ObjectMeta(
        name=ksa, namespace=plan.namespace, labels={"app.kubernetes.io/managed-by": "gpucluster"},
        annotations=dict(annotations)))
    try:
        api.core.create_namespaced_service_account(plan.namespace, body)
    except Exception as exc:  # the client's ApiException is in the SDK, imported lazily: non-API errors re-raise
        if not _is_api_error(exc) or _status(exc) != 409:  # 409: made by an earlier run
            raise LaunchError(f"cannot create the service account {plan.namespace}/{ksa} for object storage: "
                              f"{_status(exc)} {getattr(exc, 'reason', exc)}") from None
