"""Outputs come back: what every node's output folder holds is copied to this machine before
teardown, and each node's copy gets a verdict.

- `check_output_dest(value, store)`: the `--output DIR|URL` check made before anything starts. DIR
  must be creatable and writable, and new or empty. A bucket URL is accepted only where the run's
  backend declares that scheme (the plugin's `ObjectStore`: aws takes s3://); then each node uploads
  its own folder to URL/RUN_ID/node-N (`infra/ssh/objects.py`) and nothing is copied back here;
  what the job wrote in its working folder goes to URL/RUN_ID/workdir/node-N the same way
  (`workdir_push_script`, `workdir_pushed`).
- `NodeOutputs`: one node's copy (where it went, files, bytes, seconds, verdict, detail). The
  verdict is `complete` (every file the node's folder listed is here), `partial` (some came back;
  `detail` says what is missing), or `failed` (nothing came back; `detail` says why).
- `extract_stream(fileobj, dest)`: a tar stream (from `tar -cf - .` on a node) unpacked member by
  member; only regular files and folders inside `dest` are written (absolute names, `..`, links,
  devices are refused and named), so a node cannot write outside its own folder here.
- `measure(path)`: files and bytes under a local folder, and what could not be read.
"""

from __future__ import annotations

import os
import stat
import tarfile
import threading
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Callable, Protocol

from gpucluster.errors import UsageError
from gpucluster.states import DestKind, JsonMapping, JsonObject, OutputVerdict

if TYPE_CHECKING:
    from gpucluster.infra.contract import Plugin
    from gpucluster.watch.launch import JobSpec
    from gpucluster.watch.staging import Readers

COMPLETE, PARTIAL, FAILED = OutputVerdict.COMPLETE, OutputVerdict.PARTIAL, OutputVerdict.FAILED
VERDICTS = (COMPLETE, PARTIAL, FAILED)
OUTPUT_ENV = "GPUCLUSTER_OUTPUT_DIR"


@dataclass
class NodeOutputs:
    node_rank: int
    path: str  # where this node's outputs are on this machine
    verdict: OutputVerdict
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    detail: str | None = None
    workdir_files: int = 0  # files the job wrote in its working folder, beside the output folder
    workdir_bytes: int = 0

    def to_dict(self) -> JsonObject:
        return asdict(self)

    def problem(self) -> str | None:
        """One line naming the node when its copy is not complete."""
        if self.verdict == COMPLETE:
            return None
        return f"outputs of node {self.node_rank} {self.verdict}: {self.detail or 'no detail'}"


WORKDIR = "workdir"  # job.output_dir/workdir/node-N: what each node's job wrote in its working folder


def workdir_dest(output_dir: str | os.PathLike, rank: int) -> Path:
    return Path(output_dir) / WORKDIR / f"node-{rank}"


def add_workdir(out: NodeOutputs, files: int, nbytes: int, problems: list[str]) -> NodeOutputs:
    """Fold the copy of a node's working folder into its outputs verdict: the counts are kept
    apart (`workdir_files`, `workdir_bytes`), each problem (files over the size limit, unreadable
    files, a broken copy) makes the node's verdict at best *partial* and is named in `detail`."""
    out.workdir_files, out.workdir_bytes = files, nbytes
    if problems:
        if out.verdict == COMPLETE or (out.verdict == FAILED and files):
            out.verdict = PARTIAL
        out.detail = "; ".join(([out.detail] if out.detail else []) + [f"working folder: {p}" for p in problems])
    return out


def workdir_args(job: JobSpec, root: str, marker: str, tool_files: tuple[str, ...] = (),
                 output_dir: str | None = None) -> list[str]:
    """The arguments of `gpucluster/node/workdir.py` for a node whose job ran in `root`: what was laid
    down before `marker` is not taken, nor the node's output folder `output_dir` when it lies in
    `root` (copied on its own; a folder the job names `outputs` elsewhere, Hydra's, is the job's),
    the --data and --resume folders, and `tool_files` (gpucluster's own files when `root` is the
    run folder)."""
    from gpucluster.watch.staging import staged_mounts
    from gpucluster.node.workdir import DEFAULT_LIMIT

    skip = list(tool_files)
    if output_dir:
        inside = os.path.relpath(os.path.normpath(output_dir), os.path.normpath(root))
        if inside != "." and not inside.startswith(".."):
            skip.append(inside)
    for m in staged_mounts(job):
        dest = os.path.normpath(m.dest)
        if not dest.startswith(".."):
            skip.append(dest)
    limit = DEFAULT_LIMIT if job.collect_limit is None else job.collect_limit
    args = [root, "--since", marker, "--limit", str(limit)]
    for s in skip:
        args += ["--exclude", s]
    for pat in job.collect:
        args += ["--collect", pat]
    return args


def workdir_problems(answer: JsonMapping, limit: int | None) -> list[str]:
    """The problems a node's working-folder copy reported (`gpucluster/node/workdir.py`'s JSON line)."""
    from gpucluster.node.workdir import DEFAULT_LIMIT

    out = []
    if answer.get("over"):
        out.append(named(f"over the {fmt_bytes(DEFAULT_LIMIT if limit is None else limit)} limit per node "
                         "were not copied (raise it with --collect-limit, or narrow with --collect)", answer["over"]))
    if answer.get("unreadable"):
        out.append(named("could not be read", answer["unreadable"]))
    return out


WORKDIR_STAGE = ".gpucluster-workdir-upload"  # in a node's run folder: the chosen files, linked, for the upload
PICK_FAILED_RC = 9  # the upload script's exit code when choosing the files failed


def workdir_url(output_url: str, run_id: str, rank: int) -> str:
    """Where a node uploads what its job wrote in its working folder: URL/RUN_ID/workdir/node-N, beside
    URL/RUN_ID/node-N (its output folder), so the report's `.../workdir/node-N` names it."""
    return f"{output_url.rstrip('/')}/{run_id}/{WORKDIR}/node-{rank}"


def workdir_push_script(python: str, program: str, args: list[str], stage: str, push: str) -> str:
    """A POSIX sh script for a node whose outputs go to object storage: gpucluster/node/workdir.py (`program`,
    with `args` from `workdir_args`) puts the chosen files under `stage` (its JSON line on stderr), then
    `push` (the backend's node transfer program, uploading `stage`) runs; its answer is on stdout."""
    import shlex

    return (f"{shlex.quote(python)} {shlex.quote(program)} {shlex.join(args)} --into {shlex.quote(stage)} >&2 "
            f"|| exit {PICK_FAILED_RC}\n{push}")


def workdir_pushed(where: str, who: str, rc: int | None, stdout: str, stderr: str, seconds: float,
                   limit: int | None) -> tuple[int, int, list[str]]:
    """(files, bytes, problems) of a node's working-folder upload (`workdir_push_script`): the counts are
    what was uploaded; the problems name what is over the limit or unreadable, and a failed upload."""
    import json

    picked: JsonObject | None = None
    other: list[str] = []
    for line in (ln.strip() for ln in stderr.splitlines()):
        if not line:
            continue
        try:
            value = json.loads(line)
        except ValueError:
            value = None
        if isinstance(value, dict) and "over" in value and "files" in value:
            picked = value
        else:
            other.append(line)
    if picked is None or rc == PICK_FAILED_RC:
        return 0, 0, [f"{who}: choosing what to upload failed (exit code {rc})"
                      + (": " + "; ".join(other[-3:]) if other else "")]
    answer: JsonObject = {}
    for line in reversed([ln for ln in stdout.splitlines() if ln.strip()]):
        try:
            answer = json.loads(line)
            break
        except ValueError:
            continue
    why = other[-1][-400:] if other else ("the command's exit status was lost" if rc is None else f"exit code {rc}")
    up = pushed(0, where, who, rc, answer if isinstance(answer, dict) else {}, why, seconds)
    problems = workdir_problems(picked, limit)
    if up.verdict != COMPLETE:
        problems.append(up.detail or f"{who}: upload to {where} failed")
    return up.files, up.bytes, problems


# Nodes are copied in parallel (threads of this process) into folders under one shared parent
# (workdir/node-N): a copy that brought nothing removes its node-N and, when empty, the parent,
# while another node's copy may be creating its node-N there (pathlib makes the parent, then the
# folder: a parent removed in between fails that copy with ENOENT). Both hold this lock.
_TREE = threading.Lock()


def make_dest(dest: Path) -> None:
    """`dest` and its parents, safe against a sibling copy's `remove_if_empty` (see _TREE)."""
    with _TREE:
        dest.mkdir(parents=True, exist_ok=True)


def remove_if_empty(dest: Path) -> None:
    """A working-folder copy that brought nothing leaves no empty node-N (nor workdir/) behind."""
    with _TREE:
        for d in (dest, dest.parent):
            try:
                d.rmdir()
            except OSError:
                return


def named(what: str, items: list[str], show: int = 5) -> str:
    """'N file(s) WHAT: a; b; c ...'."""
    return (f"{len(items)} file(s) {what}: " + "; ".join(items[:show])
            + (f" (and {len(items) - show} more)" if len(items) > show else ""))


def pushed(rank: int, where: str, who: str, rc: int | None, answer: JsonMapping, why: str,
           seconds: float) -> NodeOutputs:
    """The verdict of a node's upload of its output folder to object storage (`where`), from the
    node transfer program's exit code (0 done, 3 some files failed) and last JSON line (`answer`:
    files, bytes, failed); `why` is its error when the answer lists no failed files."""
    files, nbytes, failed = int(answer.get("files", 0)), int(answer.get("bytes", 0)), answer.get("failed") or []
    if rc == 0:
        return NodeOutputs(rank, where, COMPLETE, files, nbytes, seconds)
    what = "; ".join(map(str, failed[:5])) + (" ..." if len(failed) > 5 else "") if failed else why
    if rc == 3 and files:
        return NodeOutputs(rank, where, PARTIAL, files, nbytes, seconds,
                           f"{who}: {len(failed)} file(s) not uploaded: {what}")
    return NodeOutputs(rank, where, FAILED, files, nbytes, seconds, f"{who}: upload to {where} failed: {what}")


def check_output_dest(value: str, store: Plugin | None = None, readers: Readers | None = None) -> Path | str:
    """`--output DIR`, checked without creating anything: an absolute Path, or UsageError (exit 2).
    With `store` (the run's backend) a URL of its `object_store` scheme is checked for form and
    returned normalized (a str); `readers` (`staging.Readers`) names the backends that read a
    refused URL's scheme."""
    from gpucluster.watch.staging import object_refusal

    text = (value or "").strip()
    if not text:
        raise UsageError("output '' is not allowed: give a folder on this machine (DIR)")
    scheme = text.split("://", 1)[0].lower() if "://" in text else ""
    if scheme in (DestKind.S3, DestKind.GS):  # a bucket (OutputDest.of, for JobSpec.output)
        refusal = object_refusal("--output", text, store, readers)
        if refusal:
            raise UsageError(f"{refusal}; give a folder on this machine (outputs are copied back to it before "
                             "teardown)")
        if store is None:  # never: without a backend object_refusal refuses every URL
            raise ValueError(f"check_output_dest: {text!r} is checked without a backend")
        return store.object_url(text, f"--output {value!r}")
    if "://" in text:
        raise UsageError(f"output {value!r} is not allowed: a folder on this machine (DIR)")
    path = Path(os.path.abspath(os.path.expanduser(text)))
    fstype = virtual_fs(path)
    if fstype:
        raise UsageError(f"output {value!r} is not allowed: it is on a {fstype} file system the kernel makes up "
                         "(nothing can be kept there); give a folder on a disk")
    if path.exists():
        if not path.is_dir():
            raise UsageError(f"output {value!r} is not allowed: it exists and is not a folder")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UsageError(f"output {value!r} is not allowed: the folder is not writable")
        if any(path.iterdir()):
            raise UsageError(f"output {value!r} is not allowed: the folder is not empty "
                             "(give a new or empty folder, so no earlier outputs are mixed in)")
        return path
    parent = path.parent
    while not parent.exists():
        if parent == parent.parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"output {value!r} is not allowed: {parent} is not a folder, so it cannot be created")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"output {value!r} is not allowed: it cannot be created ({parent} is not writable)")
    return path


# file systems whose files the kernel makes up: nothing written there is kept as written
VIRTUAL_FS = frozenset({"proc", "sysfs", "devtmpfs", "devpts", "cgroup", "cgroup2", "debugfs", "tracefs",
                        "securityfs", "pstore", "bpf", "configfs", "fusectl", "mqueue", "binfmt_misc", "efivarfs",
                        "selinuxfs", "autofs", "hugetlbfs", "rpc_pipefs", "nsfs"})


def virtual_fs(path: Path) -> str | None:
    """The type of the virtual file system `path` would be on (proc, sysfs, ...), or None. From the
    mount table (/proc/self/mounts, longest mount point holding the path); where there is none,
    by the usual mount points."""
    real = os.path.realpath(path)
    try:
        with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
            mounts = [line.split()[1:3] for line in f if len(line.split()) >= 3]
    except OSError:
        mounts = [["/proc", "proc"], ["/sys", "sysfs"], ["/dev", "devtmpfs"]]
    best, kind = "", None
    for point, fstype in mounts:
        point = point.replace("\\040", " ")
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, fstype
    return kind if kind in VIRTUAL_FS else None


def measure(path: Path) -> tuple[int, int, list[str]]:
    """(files, bytes, problems) for the regular files under `path`; unreadable entries are named."""
    files = nbytes = 0
    problems: list[str] = []

    def onerror(exc: OSError) -> None:
        problems.append(f"{exc.filename}: {exc.strerror}")

    for root, _dirs, names in os.walk(path, onerror=onerror):
        for name in names:
            p = os.path.join(root, name)
            try:
                st = os.lstat(p)
            except OSError as exc:
                problems.append(f"{p}: {exc.strerror}")
                continue
            if stat.S_ISREG(st.st_mode):
                if not os.access(p, os.R_OK):
                    problems.append(f"{p}: not readable")
                    continue
                files += 1
                nbytes += st.st_size
    return files, nbytes, problems


def _safe_name(name: str) -> str | None:
    """The member's relative path, or None when it is absolute or climbs out with `..`."""
    p = PurePosixPath(name)
    if p.is_absolute() or ".." in p.parts:
        return None
    parts = [x for x in p.parts if x not in ("", ".")]
    return "/".join(parts)


class ByteReader(Protocol):
    """What `extract_stream` reads: a pipe's stdout, or the k8s backend's exec reader."""

    def read(self, n: int, /) -> bytes: ...


def _read_exact(src: ByteReader, n: int) -> bytes:
    data = src.read(n)
    if len(data) < n:
        raise tarfile.ReadError("unexpected end of data")
    return data


def _skip(src: ByteReader, n: int) -> None:
    while n > 0:
        n -= len(_read_exact(src, min(n, 1 << 20)))


def _pax(data: bytes) -> dict[str, str]:
    """A pax extended header's records (`LEN key=value\n`)."""
    out: dict[str, str] = {}
    i = 0
    while i < len(data) and data[i:i + 1] != b"\0":
        sp = data.index(b" ", i)
        length = int(data[i:sp])
        key, _, value = data[sp + 1:i + length - 1].partition(b"=")
        out[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        i += length
    return out


def extract_stream(fileobj: ByteReader, dest: Path, tally: JsonObject | None = None) -> tuple[int, int, list[str]]:
    """Unpack a tar stream (GNU, ustar or pax, as `tar -cf -` writes it) into `dest` (created):
    (files, bytes, refused members with why). Headers are parsed by `tarfile.TarInfo.frombuf`
    (checksums checked); file data goes straight from the stream to the file, in the pieces the
    stream has ready (`readinto1` where the stream has it: a BufferedReader's `readinto` would
    wait until 1 MiB is in, so the sender stalls while the file is written; that cost half the
    speed of `scp -r`). The stdlib's streaming `tarfile.open(mode="r|")` measured about 4 times
    the CPU per byte (benchmarks/outputs_copy.py), so only its header parser is used.

    `tally` ({"files", "bytes", "refused"}), when given, is kept up to date as members arrive,
    so a caller still knows what came back when the stream breaks: tarfile.TarError for a cut or
    damaged stream (one that ends without tar's end-of-archive blocks included), OSError here."""
    t = tally if tally is not None else {}
    t.setdefault("files", 0), t.setdefault("bytes", 0), t.setdefault("refused", [])
    make_dest(dest)
    longname: str | None = None
    pax: dict[str, str] = {}
    view = memoryview(bytearray(1 << 20))  # file data: stream -> buffer -> file, no other copy
    # every pipe, file and the exec reader has readinto (typing.IO does not declare it)
    readinto = getattr(fileobj, "readinto1", None) or getattr(fileobj, "readinto")
    while True:
        header = _read_exact(fileobj, tarfile.BLOCKSIZE)
        if header == tarfile.NUL * tarfile.BLOCKSIZE:
            break  # end of archive: what follows is padding
        info = tarfile.TarInfo.frombuf(header, "utf-8", "surrogateescape")
        size = info.size
        if info.type in (tarfile.GNUTYPE_LONGNAME, tarfile.GNUTYPE_LONGLINK, tarfile.XHDTYPE,
                         tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE):
            data = _read_exact(fileobj, -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE)[:size]
            if info.type == tarfile.GNUTYPE_LONGNAME:
                longname = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
            elif info.type in (tarfile.XHDTYPE, tarfile.SOLARIS_XHDTYPE):
                pax = _pax(data)
            continue
        name = pax.get("path") or longname or info.name
        if "size" in pax:
            size = int(pax["size"])
        longname, pax = None, {}
        padded = -(-size // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
        rel = _safe_name(name)
        regular = info.type in tarfile.REGULAR_TYPES and info.type != tarfile.GNUTYPE_SPARSE
        if rel is None:
            t["refused"].append(f"{name} (a path outside the output folder)")
        elif info.type == tarfile.DIRTYPE:
            if rel:
                (dest / rel).mkdir(parents=True, exist_ok=True)
        elif not regular or not rel:
            t["refused"].append(f"{rel or name} (not a regular file: links and devices are not copied)")
        else:
            _write_member(readinto, view, dest, rel, size, info.mode)
            _skip(fileobj, padded - size)
            t["files"] += 1
            t["bytes"] += size
            continue
        _skip(fileobj, padded)
    while fileobj.read(1 << 20):  # tar's record padding: read to the end, the sender never blocks
        pass
    return t["files"], t["bytes"], t["refused"]


def _write_member(readinto: Callable[[memoryview], int | None], view: memoryview, dest: Path, rel: str, size: int,
                  mode: int) -> None:
    """One regular file of a tar stream, `size` bytes read through `view` straight into `dest/rel`
    (its mode kept, owner-writable); a file cut short is removed, never left looking whole."""
    target = dest / rel
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(target, "wb", buffering=0) as out:
            left = size
            while left:
                n = readinto(view[:min(left, len(view))])
                if not n:
                    raise tarfile.ReadError(f"unexpected end of data in {rel}")
                out.write(view[:n])
                left -= n
    except BaseException:  # Ctrl-C included: a file cut short is never left looking whole
        target.unlink(missing_ok=True)  # a file cut short is not left looking whole
        raise
    os.chmod(target, (mode & 0o777) | 0o600)


def summary(outputs: list[JsonObject]) -> str:
    """One line for a run's outputs: where they are and the verdicts."""
    if not outputs:
        return "no outputs collected"
    files = sum(o.get("files") or 0 for o in outputs)
    nbytes = sum(o.get("bytes") or 0 for o in outputs)
    bad = [o for o in outputs if o.get("verdict") != COMPLETE]
    where = os.path.dirname(outputs[0]["path"]) if outputs[0].get("path") else "?"
    state = COMPLETE if not bad else ", ".join(f"node {o['node_rank']} {o['verdict']}" for o in bad)
    wfiles = sum(o.get("workdir_files") or 0 for o in outputs)
    wbytes = sum(o.get("workdir_bytes") or 0 for o in outputs)
    work = ""
    if wfiles:
        nodes = sum(1 for o in outputs if o.get("workdir_files"))
        work = (f"; working folders: {wfiles} file(s), {fmt_bytes(wbytes)} from {nodes} node(s) "
                f"in {os.path.join(where, WORKDIR)}/node-N")
    return f"{where} ({files} file(s), {fmt_bytes(nbytes)}; {state}){work}"


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"
