"""`--data` over ssh: every local folder copied once per node through a content-addressed cache.

On each node the cache is `~/.cache/gpucluster/data/<sha256>` (one read-only file per distinct
content, mode 0444). Staging a run, for every node in parallel:

1. the manifest (path, sha256, size, mode of every file of every `--data` folder, hashed once
   here) goes to the node, which answers with the hashes its cache lacks;
2. a tar stream of only those files (named by hash) goes over the same ssh connection; the node
   checks each file's hash as it writes it and moves it into the cache atomically;
3. the node lays out each folder at its DEST under the job's working directory as hard links to
   the cache (a copy where a link is not possible, e.g. another file system).

A rerun with unchanged data sends the manifest only. What was sent (bytes on stdin of the ssh
command), the files and the seconds are one `stage` metric record per node (the ledger keeps it;
the report and `show` sum it). Interrupted (Ctrl-C, an error), the local ssh clients are killed
(the node-side program then dies of the closed pipe, and removes its unfinished file) and the
caller's cleanup removes the run folder; the cache keeps only complete, verified files.
"""

from __future__ import annotations


import json
import shlex
import subprocess
import tarfile
import threading
import time
from typing import IO, TYPE_CHECKING, Callable, Sequence

from gpucluster.errors import LaunchError
from gpucluster.events import RunEvents
from gpucluster.states import JsonObject
from gpucluster.watch.launch import JobSpec
from gpucluster.watch.procs import piped
from gpucluster.watch.staging import STAGE_KIND, STAGE_PY, DataMount, manifest, staged_mounts

from .session import Session, node_label, sh

if TYPE_CHECKING:
    from gpucluster.domain import Node


CACHE_DIR = "~/.cache/gpucluster/data"



class _Counter:
    """A write-only file object that counts what passes through it."""

    def __init__(self, raw: IO[bytes]):
        self.raw, self.count = raw, 0

    def write(self, data: bytes) -> int:
        self.raw.write(data)
        self.count += len(data)
        return len(data)

    def flush(self) -> None:
        self.raw.flush()


def stage(session: Session, job: JobSpec, dests: dict[int, list[str]], events: RunEvents, emit: bool = True,
          mounts: Sequence[DataMount] | None = None) -> dict[int, JsonObject]:
    """Stage local folders to every node: `mounts` (default: `job.data`, then `job.resume`), and
    `dests[rank]` the absolute DEST of each mount there. Returns {rank: stage record} (also sent to
    `events.on_metric` when `emit`); LaunchError naming each node that failed."""
    mounts = staged_mounts(job) if mounts is None else mounts
    files = [manifest(m.src) for m in mounts]
    by_hash = _by_hash(mounts, files)
    total = sum(f["size"] for fs in files for f in fs)
    nfiles = sum(len(fs) for fs in files)
    py = shlex.quote(session.launcher.python)
    cache = shlex.quote(session.launcher.data_cache)
    env = f"GPUCLUSTER_RUN_ID={shlex.quote(job.run_id)}" + (
        f" GPUCLUSTER_OWNER={shlex.quote(job.owner)}" if job.owner else "")  # matched by run id AND owner
    procs: list[subprocess.Popen[bytes]] = []
    lock = threading.Lock()
    results: dict[int, JsonObject] = {}
    errors: dict[int, str] = {}

    def one(node: Node) -> None:
        label = f"node {node.rank} ({node_label(node)})"
        start = time.monotonic()
        want = json.dumps(sorted([h, s] for h, (_, s) in by_hash.items())).encode()
        check = _remote(session, node, f"exec env {env} {py} -c {shlex.quote(STAGE_PY)} check {cache}",
                        procs, lock)
        out, err = check.communicate(want)
        if check.returncode != 0:
            raise LaunchError(f"{label}: checking the data cache failed: {_last(err, check.returncode)}")
        missing = json.loads(out.decode().strip().splitlines()[-1])
        layout = {"tar": bool(missing), "mounts": [{"dest": d, "files": fs} for d, fs in zip(dests[node.rank], files)]}
        place = _remote(session, node, f"exec env {env} {py} -c {shlex.quote(STAGE_PY)} place {cache}",
                        procs, lock)
        sink = _Counter(piped(place.stdin))
        try:
            sink.write(json.dumps(layout).encode() + b"\n")
            if missing:
                # typeshed wants a readable, seekable file for every mode; the stream mode w| only writes
                with tarfile.open(fileobj=sink, mode="w|") as tar:  # type: ignore[call-overload]
                    for h in missing:
                        path, size = by_hash[h]
                        info = tarfile.TarInfo(h)
                        info.size = size
                        with open(path, "rb") as f:
                            tar.addfile(info, f)
            piped(place.stdin).close()
        except (BrokenPipeError, OSError):
            pass  # the node's answer says why
        out = piped(place.stdout).read()
        err = piped(place.stderr).read()
        place.wait()
        if place.returncode != 0:
            raise LaunchError(f"{label}: staging the data failed: {_last(err, place.returncode)}")
        results[node.rank] = {"kind": STAGE_KIND, "files": nfiles, "bytes": total, "sent_bytes": sink.count + len(want),
                              "sent_files": len(missing), "seconds": round(time.monotonic() - start, 3),
                              **json.loads(out.decode().strip().splitlines()[-1])}

    def safe(node: Node) -> None:
        try:
            one(node)
        except LaunchError as exc:
            errors[node.rank] = str(exc)
        except Exception as exc:  # noqa: BLE001 - reported by node
            errors[node.rank] = f"node {node.rank}: staging the data failed: {type(exc).__name__}: {exc}"

    _each_node(session.nodes, safe, procs, lock)
    if errors:
        raise LaunchError("; ".join(errors[r] for r in sorted(errors)))
    for rank in sorted(results) if emit else ():
        events.on_metric(rank, results[rank])
    return results


def _by_hash(mounts: Sequence[DataMount], files: list[list[JsonObject]]) -> dict[str, tuple[str, int]]:
    """sha256 -> (a local file with that content, its size): each distinct content once."""
    by_hash: dict[str, tuple[str, int]] = {}
    for m, fs in zip(mounts, files):
        for f in fs:
            by_hash.setdefault(f["sha256"], (f"{m.src}/{f['path']}", f["size"]))
    return by_hash


def _each_node(nodes: Sequence[Node], safe: Callable[[Node], None], procs: list[subprocess.Popen[bytes]],
               lock: threading.Lock) -> None:
    """`safe(node)` on every node, one thread each, joined; interrupted (Ctrl-C included), every
    copy process is killed before it propagates; every one is waited for on the way out."""
    threads = [threading.Thread(target=safe, args=(n,), daemon=True) for n in nodes]
    try:
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except BaseException:  # Ctrl-C included: every copy process is killed before it propagates
        with lock:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        raise
    finally:
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass


def _remote(session: Session, node: Node, script: str, procs: list[subprocess.Popen[bytes]],
            lock: threading.Lock) -> subprocess.Popen[bytes]:
    argv = session.argv(node, sh(script), "-o", "ControlMaster=no", "-T")
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    with lock:
        procs.append(proc)
    return proc


def _last(err: bytes, code: int | None) -> str:
    lines = [ln for ln in err.decode("utf-8", "replace").strip().splitlines() if ln.strip()]
    return lines[-1][-300:] if lines else f"exit code {code}"
