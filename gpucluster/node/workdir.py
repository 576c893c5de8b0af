"""What a job wrote in its working folder on a node: the files it created or changed there
(outside what was shipped), chosen for copying back before teardown.

    python workdir.py ROOT --since MARKER [--exclude NAME]... [--collect PATTERN]... [--limit BYTES]

    python workdir.py ROOT --since MARKER ... --into DIR

    python workdir.py ROOT --lay-back SRC      (--resume: SRC's files copied into ROOT)

The first writes a tar stream (pax format) of the chosen files to stdout, then one JSON line to stderr:
{"files", "bytes", "over": [names over the limit], "unreadable": [...]}. With `--into DIR` the chosen
files are put under DIR instead (hard links where the filesystem allows, else copies; DIR is made even
when nothing is chosen), for the node's object-storage upload (`--output s3://...`, `gs://...`), and
the same JSON line goes to stderr.

- chosen: regular files under ROOT that were not shipped as they are now. MARKER (written when the
  job's files were laid down, before anything ran) holds the shipped list, {"files": {path: [size,
  sha1]}}: a file not in it, or of another size or content, is the job's (never by modification
  time: copies keep their source's, and a file saved just before the run is not the job's output).
  An empty MARKER (no list): files whose modification time is later than MARKER's. Never
  `__pycache__` folders (the interpreter's, not the job's), nor what is at or under a path named by --exclude (relative to ROOT: the output folder, the --data and --resume folders, the tool's own
  files); links, devices and what they point to are never followed or copied;
- `--collect PATTERN` (repeatable): only files whose relative path, or one of whose folders,
  matches a pattern (fnmatch: `*.pt`, `lightning_logs`, `ckpt/*`);
- `--limit BYTES`: files are taken in path order until the next would pass the limit; what is
  over is named in "over" (never dropped silently) and the caller's verdict is *partial*.

Standard library only: copied to ssh nodes as it is and run by the nodes' Python; the local
launcher imports `select` from it.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import stat
import sys
import tarfile

DEFAULT_LIMIT = 10 * 1000 ** 3  # bytes per node (10 GB)
NEVER_TAKEN = "__pycache__"  # a folder the interpreter writes beside imported modules


def stamp(path: str) -> str:
    """A file's content stamp: its SHA-1."""
    import hashlib

    h = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def shipped_list(root: str, rels: list[str]) -> str:
    """The MARKER text for the regular files `rels` under `root` as shipped (JSON)."""
    files = {}
    for rel in rels:
        path = os.path.join(root, rel)
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            files[rel] = [st.st_size, stamp(path)]
    return json.dumps({"files": files}, sort_keys=True)


def read_marker(path: str) -> tuple[int, dict | None]:
    """(MARKER's modification time in ns, its shipped list or None when it holds none)."""
    since = os.stat(path).st_mtime_ns
    try:
        with open(path, encoding="utf-8") as f:
            got = json.load(f)
    except (OSError, ValueError):
        return since, None
    return since, got.get("files") if isinstance(got, dict) and isinstance(got.get("files"), dict) else None


def _unchanged(path: str, st: os.stat_result, shipped: dict, rel: str) -> bool:
    was = shipped.get(rel)
    if not was or was[0] != st.st_size:
        return False
    try:
        return stamp(path) == was[1]
    except OSError:
        return False


def _matches(rel: str, patterns: list[str]) -> bool:
    if not patterns:
        return True
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatchcase(p, pat) for pat in patterns for p in prefixes)


def select(root: str, since_ns: int, exclude: list[str], patterns: list[str], limit: int,
           shipped: dict | None = None) -> tuple[list[tuple[str, int]], list[str], list[str]]:
    """([(relative path, size)] to copy, [over the limit: 'path (size)'], [unreadable: 'path: why']).
    `shipped`: the shipped list (path -> [size, sha1]); None: files newer than `since_ns`."""
    chosen: list[tuple[str, int]] = []
    over: list[str] = []
    unreadable: list[str] = []
    total = 0
    skip = {os.path.normpath(e).replace(os.sep, "/") for e in exclude}

    def onerror(exc: OSError) -> None:
        unreadable.append(f"{os.path.relpath(exc.filename or root, root)}: {exc.strerror}")

    for top, dirs, names in os.walk(root, onerror=onerror):
        rel_top = os.path.relpath(top, root).replace(os.sep, "/")
        pre = "" if rel_top == "." else rel_top + "/"
        dirs[:] = sorted(d for d in dirs if pre + d not in skip and d != NEVER_TAKEN)
        names = [n for n in names if pre + n not in skip]
        for name in sorted(names):
            path = os.path.join(top, name)
            rel = pre + name
            try:
                st = os.lstat(path)
            except OSError as exc:
                unreadable.append(f"{rel}: {exc.strerror}")
                continue
            if not stat.S_ISREG(st.st_mode) or not _matches(rel, patterns):
                continue
            if shipped is None and st.st_mtime_ns <= since_ns:
                continue
            if not os.access(path, os.R_OK):
                unreadable.append(f"{rel}: not readable")
                continue
            if total + st.st_size > limit:
                over.append(f"{rel} ({st.st_size} B)")
                continue
            if shipped is not None and _unchanged(path, st, shipped, rel):
                continue
            total += st.st_size
            chosen.append((rel, st.st_size))
    return chosen, over, unreadable


def lay_back(src: str, root: str) -> tuple[int, int]:
    """--resume: the regular files under `src` (an earlier run's copy of one node's working folder)
    written into `root`, replacing what is there, writable by the job, dated now (so they come back
    with this run too and a later --resume finds them); links and what is not a file are skipped.
    (files, bytes)."""
    import shutil

    files = nbytes = 0
    for top, dirs, names in os.walk(src):
        dirs[:] = [d for d in dirs if d != NEVER_TAKEN]  # an earlier run's copy may hold the interpreter's caches
        for name in names:
            path = os.path.join(top, name)
            if not stat.S_ISREG(os.lstat(path).st_mode):
                continue
            target = os.path.join(root, os.path.relpath(path, src))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if os.path.lexists(target) and not os.path.isfile(target):
                continue  # a folder or link of the job's own: left alone
            if os.path.lexists(target):
                os.unlink(target)  # a hard link to a cache file (read-only) is not written through
            shutil.copyfile(path, target)
            os.chmod(target, 0o644)
            files += 1
            nbytes += os.path.getsize(target)
    return files, nbytes


def put_into(root: str, chosen: list[tuple[str, int]], into: str, unreadable: list[str]) -> tuple[int, int]:
    """The chosen files under `into`, same relative paths: a hard link (the job has ended, so the file
    no longer changes), else a copy; what cannot be read or written is added to `unreadable`. (files, bytes)."""
    import shutil

    os.makedirs(into, exist_ok=True)
    files = nbytes = 0
    for rel, _size in chosen:
        src, dst = os.path.join(root, rel), os.path.join(into, rel)
        try:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if os.path.lexists(dst):
                os.unlink(dst)
            try:
                os.link(src, dst)
            except OSError:
                shutil.copyfile(src, dst)
            nbytes += os.lstat(dst).st_size
        except OSError as exc:
            unreadable.append(f"{rel}: {exc.strerror}")
            continue
        files += 1
    return files, nbytes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="workdir.py")
    ap.add_argument("root")
    ap.add_argument("--lay-back", default=None, help="copy this folder's files into ROOT (--resume), then exit")
    ap.add_argument("--since")
    ap.add_argument("--exclude", action="append", default=[])
    ap.add_argument("--collect", action="append", default=[])
    ap.add_argument("--limit", type=int, default=DEFAULT_LIMIT)
    ap.add_argument("--into", default=None, help="put the chosen files under this folder instead of a tar stream")
    a = ap.parse_args(argv)
    if a.lay_back:
        files, nbytes = lay_back(a.lay_back, a.root)
        print(json.dumps({"files": files, "bytes": nbytes}))
        return 0
    if not a.since:
        ap.error("--since is required")
    since, shipped = read_marker(a.since)
    chosen, over, unreadable = select(a.root, since, a.exclude, a.collect, a.limit, shipped)
    if a.into:
        files, nbytes = put_into(a.root, chosen, a.into, unreadable)
        sys.stderr.write(json.dumps({"files": files, "bytes": nbytes, "over": over, "unreadable": unreadable}) + "\n")
        return 0
    files = nbytes = 0
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for rel, _size in chosen:
            path = os.path.join(a.root, rel)
            try:
                with open(path, "rb") as f:
                    info = tar.gettarinfo(arcname=rel, fileobj=f)
                    tar.addfile(info, f)  # the size read at open: a file still growing is cut there
            except OSError as exc:
                unreadable.append(f"{rel}: {exc.strerror}")
                continue
            files += 1
            nbytes += info.size
    sys.stdout.buffer.flush()
    sys.stderr.write(json.dumps({"files": files, "bytes": nbytes, "over": over, "unreadable": unreadable}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
