"""Outputs out of the pods, through the Kubernetes exec API (`connect_get_namespaced_pod_exec` over
`kubernetes.stream.stream`, `binary=True` so stdout comes as bytes, not text decoded as UTF-8).

Kubernetes cannot exec into a container that has ended, so every pod with a run folder has a second
container, the keeper (`plan.KEEPER`, `pod_keeper.py`), that stays running after torchrun (and
with it the training container) has ended, until the file `collected` exists in the control folder;
every exec goes to it (`Plan.exec_container`). Here:

- `stop_pods`: a file `stop` in each still-running pod's control folder; the entry script stops
  torchrun (SIGTERM, then SIGKILL), so the pod can still be copied from after a failure,
  `--max-minutes` or Ctrl-C.
- `collect`: one fresh pod listing, then for every node whose container ran: `PACK` (a
  standard-library tar writer, run with the image's python) streams the output folder, unpacked here
  by `gpucluster.watch.outputs.extract_stream` (only regular files and folders inside `node-N`; absolute
  names, `..`, links and devices are refused and named); with a shipped script, what the job wrote
  in its working folder (`gpucluster/node/workdir.py`, shipped in the ConfigMap) the same way into
  `workdir/node-N`; then `collected` is made. A pod that is gone, terminating or ended gets the
  verdict failed, with why.
"""

from __future__ import annotations

import json
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TypeVar

from gpucluster.watch.outputs import COMPLETE, FAILED, PARTIAL, NodeOutputs, extract_stream

from .plan import CODE_DIR, COLLECTED_FILE, MOUNT, OUTPUT_DIR, RUN_DIR, SETUP_GO_FILE, SHIPPED_MARK, STOP_FILE, Plan

if TYPE_CHECKING:
    from gpucluster.states import JsonObject
    from gpucluster.watch.launch import JobSpec

    from .api import KubeApi, KubeObject, Retry
    from .platform import ObjectTransfer

T = TypeVar("T")


def _program(name: str) -> str:
    """The text of a program that runs on a node (a file of this package, shipped by content)."""
    return (Path(__file__).parent / name).read_text()


NO_OUTPUT_RC = 3
IDLE_S = 120.0  # an exec stream silent this long is given up
# Run in the pod with the image's python: the folder argv[1] as a tar stream (pax) on stdout, members
# in a stable order; what cannot be read is named on stderr and makes the exit code 2.
PACK = _program("pod_pack.py")
# Makes the file argv[1] (and its folder: without a collected output folder nothing else makes it).
TOUCH = _program("pod_touch.py")


def _exec(api: KubeApi, plan: Plan, pod: str, command: list[str], stdin: bool = False, container: str | None = None
          ) -> KubeObject:
    """A WSClient (or the fake's) for `command` in the pod's container: stdout and stderr as bytes;
    with `stdin`, `write_stdin` sends to the command (its stdin is never closed: see stage). Each exec
    gets its own ApiClient (`KubeApi.exec_core`): exec runs in threads while the main thread lists pods."""
    try:
        return api.stream(api.exec_core().connect_get_namespaced_pod_exec, pod, plan.namespace, command=command,
                          container=container or plan.exec_container, stdin=stdin, stdout=True, stderr=True, tty=False,
                          binary=True, _preload_content=False)
    except AttributeError as exc:
        # kubernetes 36's ApiClient decodes the body of the ApiException(status=0) that websocket_call raises
        # for a refused handshake, which has none: the AttributeError hides it. Raise what it hides.
        hidden = exc.__context__
        if hidden is not None and getattr(hidden, "status", None) is not None:
            raise hidden from None
        raise


class _ExecReader:
    """File-like (`read`, `readinto`) view of an exec's stdout; stderr is kept apart."""

    def __init__(self, client: KubeObject, idle_s: float = IDLE_S):
        self.client, self.idle_s = client, idle_s
        self.buf = bytearray()
        self.stderr = bytearray()

    def _take(self) -> bool:
        got = False
        for read, into in ((self.client.read_stdout, self.buf), (self.client.read_stderr, self.stderr)):
            data = read(timeout=0)
            if data:
                into += data if isinstance(data, bytes) else data.encode()
                got = got or into is self.buf
        # ws_client.WSClient.update also appends every stdout/stderr frame to `_all` (capture_all,
        # which stream() gives no way to turn off) for read_all(); nothing reads it here, so it is
        # emptied rather than growing to the size of the whole output folder.
        if hasattr(self.client, "_all"):
            self.client._all = self.client._all.__class__()
        return got

    def _fill(self) -> bool:
        last = time.monotonic()
        while not self.buf:
            if self._take():
                return True
            if not self.client.is_open():
                return self._take()
            self.client.update(timeout=1)
            if time.monotonic() - last > self.idle_s:
                raise OSError(f"the exec stream sent nothing for {self.idle_s:.0f} s")
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            everything = bytearray()
            while self.buf or self._fill():
                everything += self.buf
                self.buf = bytearray()
            return bytes(everything)
        while len(self.buf) < n:  # like a buffered pipe: short only at the end of the stream
            more = bytes(self.buf)
            self.buf = bytearray()
            if not self._fill():
                self.buf = bytearray(more)
                break
            self.buf[:0] = more
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def readinto(self, view: memoryview) -> int:
        """What has arrived, up to len(view) (may be short, as a raw read)."""
        if not self.buf and not self._fill():
            return 0
        n = min(len(view), len(self.buf))
        view[:n] = self.buf[:n]
        del self.buf[:n]
        return n

    def returncode(self) -> int | None:
        try:
            return self.client.returncode
        except Exception:  # noqa: BLE001 - the stream broke before Kubernetes sent the status
            return None


def _run(api: KubeApi, plan: Plan, pod: str, command: list[str], retry: Retry | None = None,
         container: str | None = None) -> tuple[int | None, str]:
    """(exit code, stderr) of a short command in the pod; the exit code is None when unknown. An exec the
    API server refuses transiently (a control plane away) is opened again (`api.Retry`)."""
    from .api import Retry

    client = (retry or Retry()).call(_exec, api, plan, pod, command, False, container)
    reader = _ExecReader(client, idle_s=30)
    try:
        reader.read()
        return reader.returncode(), reader.stderr.decode("utf-8", "replace")
    finally:
        client.close()


# Execs at once (stop, release, copy): each is a websocket through the API server to the kubelet
# and a process started in the container; one after the other, 64 pods took 14.6 s to be told to
# stop after a failure (benchmarks/scale_k8s.py), the run's end waiting on the last.
EXEC_WORKERS = 8


def _each(pods: dict[int, str], fn: Callable[[int, str], T]) -> list[T]:
    """fn(rank, name) for every pod, EXEC_WORKERS at a time; the results in rank order."""
    if not pods:
        return []
    with ThreadPoolExecutor(max_workers=min(EXEC_WORKERS, len(pods))) as pool:
        return list(pool.map(lambda item: fn(*item), sorted(pods.items())))


def stop_pods(api: KubeApi, plan: Plan, pods: dict[int, str], grace: float | None = None) -> None:
    """Ask each pod (rank -> name) to stop its torchrun; the container stays for the copy. `grace`: the
    seconds its ranks get to save before SIGKILL (a notice's), written into the stop file (else the
    entry script's own)."""
    def one(rank: int, name: str) -> None:
        try:
            _run(api, plan, name, ["python", "-c", TOUCH, STOP_FILE] + ([f"{grace:g}"] if grace else []))
        except Exception:  # noqa: BLE001 - a pod that is gone has nothing left to stop
            pass

    _each(pods, one)


def release_pods(api: KubeApi, plan: Plan, pods: dict[int, str]) -> list[str]:
    """--setup: every pod's setup succeeded; make the go file in each (rank -> name), so each
    setup wrapper execs torchrun. Returns what went wrong, one line per pod (empty: all released)."""
    def one(rank: int, name: str) -> str | None:
        try:
            rc, err = _run(api, plan, name, ["python", "-c", TOUCH, SETUP_GO_FILE])
        except Exception as exc:  # noqa: BLE001 - ApiException, a broken stream: the run fails naming it
            rc, err = None, str(exc)
        if rc != 0:
            return (f"cannot start torchrun on node {rank} (pod {name}) after its setup: "
                    + (err.strip().splitlines()[-1] if err.strip() else f"exit code {rc}"))
        return None

    return [e for e in _each(pods, one) if e is not None]


@dataclass
class _Received:
    """What a tar stream from a pod brought."""

    files: int = 0
    bytes: int = 0
    refused: list[str] = field(default_factory=list)  # members refused, with why
    rc: int | None = None  # the command's exit code (None: unknown)
    stderr: str = ""
    broken: str | None = None  # why the copy stopped, or None
    refused_exec: Exception | None = None  # the exec's refusal


def _receive(api: KubeApi, plan: Plan, pod: str, command: list[str], dest: Path) -> _Received:
    """A tar stream from `command` in the pod, unpacked safely into `dest`."""
    got = _Received()
    try:
        client = _exec(api, plan, pod, command)
    except Exception as exc:  # noqa: BLE001 - ApiException (the handshake refused), connection errors
        got.refused_exec = exc
        return got
    reader = _ExecReader(client)
    tally: JsonObject = {"files": 0, "bytes": 0, "refused": []}  # kept up to date as members arrive
    try:
        try:
            extract_stream(reader, dest, tally)
        except (OSError, tarfile.TarError) as exc:
            got.broken = f"the copy stopped after {tally['files']} file(s): {exc}"
        got.rc = reader.returncode()
    finally:
        client.close()
    got.files, got.bytes, got.refused = int(tally["files"]), int(tally["bytes"]), list(tally["refused"])
    got.stderr = reader.stderr.decode("utf-8", "replace")
    return got


def copy_pod(api: KubeApi, plan: Plan, rank: int, pod: str, dest: Path) -> NodeOutputs:
    """The pod's output folder into `dest`, with the verdict (as the ssh launcher's copies)."""
    who = f"node {rank} (pod {pod})"
    start = time.monotonic()
    out = NodeOutputs(rank, str(dest), COMPLETE)
    got = _receive(api, plan, pod, ["python", "-c", PACK, OUTPUT_DIR], dest)
    if got.refused_exec is not None:
        out.verdict, out.detail = FAILED, f"{who}: the exec API refused the copy: {got.refused_exec}"
        return out
    rc, broken = got.rc, got.broken
    out.files, out.bytes, out.seconds = got.files, got.bytes, time.monotonic() - start
    if rc == NO_OUTPUT_RC:
        out.verdict, out.detail = FAILED, f"{who}: no output folder {OUTPUT_DIR} in the pod"
        return out
    missing: list[str] = []
    if rc is None and not broken:
        missing.append("the exec stream ended without the command's exit status")
    elif rc not in (0, None):
        lines = [ln.strip() for ln in got.stderr.splitlines() if ln.strip()]
        missing.append(f"packing the folder in the pod exited with code {rc}"
                       + (": " + "; ".join(lines[-5:]) if lines else ""))
    if broken:
        missing.append(broken)
    refused = got.refused
    if refused:
        missing.append(f"{len(refused)} entr{'y' if len(refused) == 1 else 'ies'} refused: "
                       + "; ".join(refused[:5]) + (" ..." if len(refused) > 5 else ""))
    if missing:
        out.verdict = PARTIAL if out.files else FAILED
        out.detail = f"{who}: " + "; ".join(missing)
    return out


def copy_workdir(api: KubeApi, plan: Plan, pod: str, job: JobSpec, dest: Path) -> tuple[int, int, list[str]]:
    """What the job wrote in its working folder (CODE_DIR) in the pod, into `dest`, chosen there by
    gpucluster/node/workdir.py (shipped in the ConfigMap): files newer than SHIPPED_MARK, outside the --data
    and --resume folders, within --collect patterns and the size limit. (files, bytes, problems), as the
    ssh launcher's copy (`infra/ssh/workdir_copy.py`)."""
    from gpucluster.watch.outputs import named, remove_if_empty, workdir_args, workdir_problems

    args = workdir_args(job, CODE_DIR, SHIPPED_MARK)
    got = _receive(api, plan, pod, ["python", f"{MOUNT}/workdir.py", *args], dest)
    if got.refused_exec is not None:
        return 0, 0, [f"the exec API refused the copy: {got.refused_exec}"]
    problems: list[str] = [got.broken] if got.broken else []
    lines = [ln.strip() for ln in got.stderr.splitlines() if ln.strip()]
    answer: JsonObject = {}
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except ValueError:
        pass
    if got.rc != 0 or not isinstance(answer, dict) or "files" not in answer:
        problems.append(f"the copy program exited with code {got.rc}" + (": " + "; ".join(lines[-3:]) if lines
                                                                             else ""))
        answer = {}
    problems += workdir_problems(answer, job.collect_limit)
    if got.refused:
        problems.append(named("refused (links, devices, paths outside)", got.refused))
    remove_if_empty(dest)
    return got.files, got.bytes, problems


def push_workdir(api: KubeApi, plan: Plan, pod: str, job: JobSpec, where: str, objects: ObjectTransfer | None
                 ) -> tuple[int, int, list[str]]:
    """`--output gs://...`: what the job wrote in its working folder (chosen by gpucluster/node/workdir.py as for
    a copy home) uploaded by the pod itself to `where` (URL/RUN_ID/workdir/node-N), through a folder of
    hard links beside the working folder. (files, bytes, problems), as `copy_workdir`."""
    from gpucluster.watch.outputs import WORKDIR_STAGE, workdir_args, workdir_push_script, workdir_pushed

    who = f"pod {pod}"
    if objects is None:
        return 0, 0, [f"{who}: this backend's pods cannot write object storage"]
    stage = f"{RUN_DIR}/{WORKDIR_STAGE}"
    script = workdir_push_script("python", f"{MOUNT}/workdir.py", workdir_args(job, CODE_DIR, SHIPPED_MARK), stage,
                                 objects.script("python", "push", stage, where))
    start = time.monotonic()
    try:
        client = _exec(api, plan, pod, ["sh", "-c", script])
    except Exception as exc:  # noqa: BLE001 - ApiException (the handshake refused), connection errors
        return 0, 0, [f"{who}: the exec API refused the upload: {exc}"]
    out, rc, err = _read_all(client)
    return workdir_pushed(where, who, rc, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"),
                          time.monotonic() - start, job.collect_limit)


def _read_all(client: KubeObject) -> tuple[bytes, int | None, bytes]:
    """An exec's stdout, its exit code (None: lost with the stream) and its stderr; the client closed."""
    reader = _ExecReader(client)
    try:
        out = reader.read()
        rc = reader.returncode()
    except OSError as exc:
        out, rc = b"", None
        reader.stderr += str(exc).encode()
    finally:
        client.close()
    return out, rc, bytes(reader.stderr)


def push_pod(api: KubeApi, plan: Plan, rank: int, pod: str, where: str, objects: ObjectTransfer | None) -> NodeOutputs:
    """`--output gs://...`: the pod uploads its output folder to `where` itself, with its own
    credentials (the backend's node transfer program, `objects.script(..., "push", ...)`)."""
    from gpucluster.watch.outputs import pushed

    who = f"node {rank} (pod {pod})"
    if objects is None:
        return NodeOutputs(rank, where, FAILED, detail=f"{who}: this backend's pods cannot write object storage")
    start = time.monotonic()
    try:
        client = _exec(api, plan, pod, ["sh", "-c", objects.script("python", "push", OUTPUT_DIR, where)])
    except Exception as exc:  # noqa: BLE001 - ApiException (the handshake refused), connection errors
        return NodeOutputs(rank, where, FAILED, detail=f"{who}: the exec API refused the upload: {exc}")
    out, rc, stderr = _read_all(client)
    lines = [ln for ln in out.decode("utf-8", "replace").splitlines() if ln.strip()]
    try:
        answer = json.loads(lines[-1]) if lines else {}
    except json.JSONDecodeError:
        answer = {}
    err = [ln.strip() for ln in stderr.decode("utf-8", "replace").splitlines() if ln.strip()]
    why = err[-1][-400:] if err else ("the exec stream ended without the command's exit status" if rc is None
                                      else f"exit code {rc}")
    return pushed(rank, where, who, rc, answer if isinstance(answer, dict) else {}, why, time.monotonic() - start)


def collect(api: KubeApi, plan: Plan, ran: dict[int, str], dest: Path | str, objects: ObjectTransfer | None = None,
            job: JobSpec | None = None) -> list[NodeOutputs]:
    """Every node whose container ran (`ran`: rank -> pod name): its copy and verdict, nodes in
    parallel; once every copy is done, each pod is told it was collected (its keeper exits).
    `dest` an object-storage URL (`--output gs://...`): each pod uploads to URL/RUN_ID/node-N."""
    if not ran:
        return []
    listed: dict[str, KubeObject] = {}
    error = None
    try:
        for pod in api.core.list_namespaced_pod(plan.namespace, label_selector=plan.selector).items:
            listed[pod.metadata.name] = pod
    except Exception as exc:  # noqa: BLE001 - the copies are still tried; exec says what it can
        error = exc

    url = str(dest).rstrip("/") if "://" in str(dest) else None

    def one(rank: int) -> NodeOutputs:
        name = ran[rank]
        where = f"{url}/{plan.run_id}/node-{rank}" if url else None  # the pod uploads there
        folder = Path(dest) / f"node-{rank}"  # else copied into here
        target = where if where is not None else str(folder)
        pod = listed.get(name)
        if error is None and pod is None:
            return NodeOutputs(rank, str(target), FAILED, detail=(
                f"node {rank}: pod {name} is gone (deleted, evicted, or its node was preempted); its output "
                "folder went with it"))
        if pod is not None and getattr(pod.metadata, "deletion_timestamp", None):
            return NodeOutputs(rank, str(target), FAILED, detail=(
                f"node {rank}: pod {name} is being deleted; its output folder cannot be read"))
        phase = getattr(pod.status, "phase", None) if pod is not None else None
        if pod is not None and phase != "Running":
            return NodeOutputs(rank, str(target), FAILED, detail=(
                f"node {rank}: pod {name} is {phase}: Kubernetes cannot exec into a container that is not "
                "running, so its output folder cannot be read"))
        got = push_pod(api, plan, rank, name, where, objects) if where is not None else \
            copy_pod(api, plan, rank, name, folder)
        if plan.code and job is not None:  # what the job wrote beside its script
            from gpucluster.watch.outputs import add_workdir, workdir_dest, workdir_url

            add_workdir(got, *(push_workdir(api, plan, name, job, workdir_url(url, plan.run_id, rank), objects)
                               if url else copy_workdir(api, plan, name, job, workdir_dest(dest, rank))))
        return got

    def collected(rank: int) -> None:
        try:
            _run(api, plan, ran[rank], ["python", "-c", TOUCH, COLLECTED_FILE])
        except Exception:  # noqa: BLE001 - the Job is deleted next anyway
            pass

    with ThreadPoolExecutor(max_workers=min(EXEC_WORKERS, len(ran))) as pool:
        got = list(pool.map(one, sorted(ran)))
        # A barrier: no pod is told it was collected before every copy is done. The keeper then ends,
        # and a pod whose torchrun failed turns Failed; the Job controller may act on that at once.
        list(pool.map(collected, sorted(ran)))
    return got
