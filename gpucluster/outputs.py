"""Outputs come back: what every node's output folder holds is copied to this machine before
teardown, and each node's copy gets a verdict.

- `check_output_dest(value, store)`: the `--output DIR|URL` check made before anything starts. DIR
  must be creatable and writable, and new or empty. A bucket URL is accepted only where the run's
  backend declares that scheme (the plugin's `ObjectStore`: aws takes s3://); then each node uploads
  its own folder to URL/RUN_ID/node-N (`infra/ssh/objects.py`) and nothing is copied back here.
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
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any

from gpucluster.errors import UsageError

COMPLETE, PARTIAL, FAILED = "complete", "partial", "failed"
VERDICTS = (COMPLETE, PARTIAL, FAILED)
OUTPUT_ENV = "GPUCLUSTER_OUTPUT_DIR"


@dataclass
class NodeOutputs:
    node_rank: int
    path: str  # where this node's outputs are on this machine
    verdict: str
    files: int = 0
    bytes: int = 0
    seconds: float = 0.0
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def problem(self) -> str | None:
        """One line naming the node when its copy is not complete."""
        if self.verdict == COMPLETE:
            return None
        return f"outputs of node {self.node_rank} {self.verdict}: {self.detail or 'no detail'}"


def pushed(rank: int, where: str, who: str, rc: int | None, answer: dict[str, Any], why: str,
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


def check_output_dest(value: str, store: Any = None) -> Path | str:
    """`--output DIR`, checked without creating anything: an absolute Path, or UsageError (exit 2).
    With `store` (the run's backend) a URL of its `object_store` scheme is checked for form and
    returned normalized (a str)."""
    from gpucluster.staging import object_refusal

    text = (value or "").strip()
    if not text:
        raise UsageError("output '' is not allowed: give a folder on this machine (DIR)")
    if text.lower().startswith(("s3://", "gs://")):
        refusal = object_refusal("--output", text, store)
        if refusal:
            raise UsageError(f"{refusal}; give a folder on this machine (outputs are copied back to it before "
                             "teardown)")
        return store.object_url(text, f"--output {value!r}")
    if "://" in text:
        raise UsageError(f"output {value!r} is not allowed: a folder on this machine (DIR)")
    path = Path(os.path.abspath(os.path.expanduser(text)))
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


def _read_exact(src: IO[bytes], n: int) -> bytes:
    data = src.read(n)
    if len(data) < n:
        raise tarfile.ReadError("unexpected end of data")
    return data


def _skip(src: IO[bytes], n: int) -> None:
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


def extract_stream(fileobj: IO[bytes], dest: Path, tally: dict[str, Any] | None = None) -> tuple[int, int, list[str]]:
    """Unpack a tar stream (GNU, ustar or pax, as `tar -cf -` writes it) into `dest` (created):
    (files, bytes, refused members with why). Headers are parsed by `tarfile.TarInfo.frombuf`
    (checksums checked); file data goes straight from the stream to the file, 1 MiB at a time.

    `tally` ({"files", "bytes", "refused"}), when given, is kept up to date as members arrive,
    so a caller still knows what came back when the stream breaks: tarfile.TarError for a cut or
    damaged stream (one that ends without tar's end-of-archive blocks included), OSError here."""
    t = tally if tally is not None else {}
    t.setdefault("files", 0), t.setdefault("bytes", 0), t.setdefault("refused", [])
    dest.mkdir(parents=True, exist_ok=True)
    longname: str | None = None
    pax: dict[str, str] = {}
    view = memoryview(bytearray(1 << 20))  # file data: stream -> buffer -> file, no other copy
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
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                with open(target, "wb", buffering=0) as out:
                    left = size
                    while left:
                        n = fileobj.readinto(view[:min(left, len(view))])
                        if not n:
                            raise tarfile.ReadError(f"unexpected end of data in {rel}")
                        out.write(view[:n])
                        left -= n
            except BaseException:
                target.unlink(missing_ok=True)  # a file cut short is not left looking whole
                raise
            os.chmod(target, (info.mode & 0o777) | 0o600)
            _skip(fileobj, padded - size)
            t["files"] += 1
            t["bytes"] += size
            continue
        _skip(fileobj, padded)
    while fileobj.read(1 << 20):  # tar's record padding: read to the end, the sender never blocks
        pass
    return t["files"], t["bytes"], t["refused"]


def summary(outputs: list[dict[str, Any]]) -> str:
    """One line for a run's outputs: where they are and the verdicts."""
    if not outputs:
        return "no outputs collected"
    files = sum(o.get("files") or 0 for o in outputs)
    nbytes = sum(o.get("bytes") or 0 for o in outputs)
    bad = [o for o in outputs if o.get("verdict") != COMPLETE]
    where = os.path.dirname(outputs[0]["path"]) if outputs[0].get("path") else "?"
    state = "complete" if not bad else ", ".join(f"node {o['node_rank']} {o['verdict']}" for o in bad)
    return f"{where} ({files} file(s), {fmt_bytes(nbytes)}; {state})"


def fmt_bytes(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n} B"
