"""Data in and setup commands: `--data SRC[:DEST]` parsed and checked before anything starts, the
manifest of a data folder (relative path, sha256, size, mode of every file), and the node-side
setup wrapper every launcher puts in front of torchrun when `--setup` is given.

Data: SRC is a local folder, or an object-storage URL (`s3://bucket[/prefix]`) where the backend's
nodes read it themselves (the plugin's `ObjectStore`; aws), synced on every node by the launcher
(`infra/ssh/objects.py`); for a URL, DEST follows the LAST ':' and defaults to `data/<last segment>`. DEST (default `data/<basename of SRC>`) is a relative path under the
job's working directory on each node. The first `--data` is exposed as `GPUCLUSTER_DATA`, all of
them as `GPUCLUSTER_DATA_DIRS` (os.pathsep-separated, in the order given). The local backend uses
SRC in place (no copy; the job must only read it); the ssh launcher (ssh and aws) copies it
through a content-addressed cache on every node (`infra/ssh/stage.py`).

Setup: each `--setup CMD` is run by `sh -c` on every node, in order, in the job's working
directory and with the job's environment, before torchrun starts; the first failure ends the
node (and so the run). The nodes start torchrun together, once every node's setup has succeeded
(a barrier file the launcher creates), so a slow setup on one node cannot time out the
rendezvous of the others.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, Sequence

from gpucluster.errors import UsageError

if TYPE_CHECKING:
    from gpucluster.infra.contract import Plugin
    from gpucluster.watch.launch import JobSpec

SETUP_START, SETUP_END = "setup_start", "setup_end"  # metric record kinds printed by the wrapper
STAGE_KIND = "stage"  # metric record per node: files, bytes, bytes sent, seconds
GO_FILE = "setup-go"  # the barrier: torchrun starts once the launcher has created it
# The node's side of a staged local folder (node_stage.py, shipped by content), the same over ssh
# (`infra/ssh/stage.py`) and in a pod (`infra/kubernetes/stage.py`). Run on each node by `python3 -c
# STAGE_PY MODE CACHE [BASE]`: "check" reads one line, a JSON list of hashes, and prints those the
# cache lacks; "place" reads one JSON line (the mounts; a relative DEST is under BASE) then, when it
# says so, a tar of files named by their hash. Neither needs its stdin to be closed: a line ends the
# check, the tar's end-of-archive blocks end the files. That is how it also runs through the
# Kubernetes exec API, whose v4 websocket protocol cannot close stdin (kubernetes/kubernetes#89899;
# only v5.channel.k8s.io adds a close signal).
STAGE_PY = (Path(__file__).parents[1] / "node" / "node_stage.py").read_text()
_URL_PREFIXES = ("s3://", "gs://")


@dataclass(frozen=True)
class DataMount:
    src: str  # absolute local folder, or an object-storage URL the nodes read themselves
    dest: str  # relative POSIX path under the job's working directory on a node

    @property
    def spec(self) -> str:
        return f"{self.src}:{self.dest}"

    @property
    def remote(self) -> bool:
        return "://" in self.src


Readers = Mapping[str, Sequence[str]]  # URL scheme -> the backends whose nodes read it (infra.registry.readers())


def object_refusal(flag: str, value: str, store: Plugin | None, readers: Readers | None = None) -> str | None:
    """Why an object-storage URL `value` cannot be used with backend `store` (None: it can, or it is
    not a URL). Says which clouds take that scheme, from `readers` (given by the caller, which asked
    the registry), never naming one here."""
    scheme = value.split("://", 1)[0].lower() if "://" in value else ""
    if not scheme or not value.lower().startswith(_URL_PREFIXES):
        return None
    if store is not None and store.object_store == scheme:
        return None
    able = list((readers or {}).get(scheme, ()))
    where = f" with --cloud {store.name}" if store is not None and able else ""
    how = f"{scheme}:// works with --cloud {' or '.join(able)}" if able else f"no backend reads {scheme}:// yet"
    return f"{flag} {value!r} is not supported yet{where}: {how}"


RUN_FOLDER_NAMES = ("code", "outputs", "workloads", "reaper.py", "workdir.py", "pgid", "cancelled", "shipped",
                    GO_FILE)  # what a node's run folder already holds beside the job's working folder (code/)


_WHERE = ("a relative path under the job's working directory, or one level up beside it ('..' once, at the "
          "start: ../data)")


def _check_dest(value: str, dest: str) -> str:
    """DEST relative to the job's working folder (`code/` in the node's run folder): it may climb
    one level (`../data`, beside the script's folder, as scripts that read `../data` expect) but
    never out of the run folder, nor onto what the run folder already holds."""
    if not dest or dest.startswith("/") or "\\" in dest or ".." in dest.split("/")[1:]:
        raise UsageError(f"--data {value!r}: DEST {dest!r} is not allowed: {_WHERE}")
    if dest.startswith(".") and not dest.startswith("../"):
        raise UsageError(f"--data {value!r}: DEST {dest!r} is not allowed: a relative path under the job's "
                         "working directory that does not start with '.'")
    dest = posixpath.normpath(dest)
    inside = posixpath.normpath(posixpath.join("code", dest))  # relative to the node's run folder
    if dest in (".", "") or inside.startswith("..") or inside == ".":
        raise UsageError(f"--data {value!r}: DEST {dest!r} is not allowed: it would leave the node's run folder; "
                         f"{_WHERE}")
    if dest.startswith("../") and inside.split("/")[0] in RUN_FOLDER_NAMES:
        raise UsageError(f"--data {value!r}: DEST {dest!r} is not allowed: the run folder already holds "
                         f"{inside.split('/')[0]!r}; give another name")
    return dest


def _object_mount(value: str, store, readers: Readers | None) -> DataMount:
    """`SCHEME://bucket[/prefix][:DEST]`: DEST follows the last ':' (bucket names hold none)."""
    refusal = object_refusal("--data", value, store, readers)
    if refusal:
        raise UsageError(f"{refusal}; give a local folder (SRC[:DEST])")
    scheme, rest = value.split("://", 1)
    url, sep, dest = rest.rpartition(":") if ":" in rest else (rest, "", "")
    url = store.object_url(f"{scheme}://{url}", f"--data {value!r}")
    if sep:
        return DataMount(url, _check_dest(value, dest))
    last = url.split("://", 1)[1].rstrip("/").rsplit("/", 1)[-1]
    return DataMount(url, f"data/{last}")


def parse_data(values: Sequence[str], store=None, readers: Readers | None = None) -> tuple[DataMount, ...]:
    """Repeatable `--data SRC[:DEST]` -> mounts; UsageError (exit 2) naming the value otherwise.
    `store`: the run's backend (`object_store`, `object_url`), for SRC URLs; None: no URL allowed.
    `readers`: which backends read each URL scheme, named when a URL is refused."""
    mounts: list[DataMount] = []
    for value in values or ():
        if value.lower().startswith(_URL_PREFIXES):
            mount = _object_mount(value, store, readers)
            _no_overlap(value, mount.dest, mounts)
            mounts.append(mount)
            continue
        src, sep, dest = value.partition(":")
        if not src:
            raise UsageError(f"--data {value!r} is not allowed: SRC[:DEST], SRC a local folder (no ':' in it)")
        path = Path(os.path.expanduser(src))
        if not path.exists():
            raise UsageError(f"--data {value!r}: the folder {src!r} does not exist; give a local folder")
        if not path.is_dir():
            raise UsageError(f"--data {value!r}: {src!r} is a file, not a folder; give the folder that holds it")
        if not os.access(path, os.R_OK | os.X_OK):
            raise UsageError(f"--data {value!r}: the folder {src!r} cannot be read")
        bad = bad_link(path)
        if bad:
            raise UsageError(f"--data {value!r}: {bad!r} is a symbolic link that {_LINK_WHY} (the folder is copied "
                             "with its links followed); remove it or make it point at a file or folder")
        dest = _check_dest(value, dest) if sep else f"data/{path.resolve().name}"
        _no_overlap(value, dest, mounts)
        mounts.append(DataMount(str(path.resolve()), dest))
    return tuple(mounts)


_LINK_WHY = "points at nothing, or loops"


def bad_link(top: Path) -> str | None:
    """The first symbolic link under `top` that a copy following links cannot take: one pointing at
    nothing, one that loops (ELOOP), or one to a folder that holds it (an endless tree)."""
    for root, dirnames, filenames in os.walk(top, followlinks=True):
        here = os.path.realpath(root)
        for name in sorted(dirnames + filenames):
            full = os.path.join(root, name)
            if not os.path.islink(full):
                continue
            if not os.path.exists(full):
                return full
            target = os.path.realpath(full)
            if os.path.isdir(full) and (here == target or here.startswith(target.rstrip(os.sep) + os.sep)):
                return full
    return None


def _no_overlap(value: str, dest: str, mounts: Sequence[DataMount]) -> None:
    for m in mounts:
        if m.dest == dest or dest.startswith(m.dest + "/") or m.dest.startswith(dest + "/"):
            raise UsageError(f"--data {value!r}: DEST {dest!r} is the same as, or overlaps, that of --data "
                             f"{m.spec!r}; give each one its own DEST (SRC:DEST)")


def parse_setup(values: Sequence[str]) -> tuple[str, ...]:
    out = []
    for value in values or ():
        if not value.strip() or "\0" in value:
            raise UsageError(f"--setup {value!r} is not allowed: a non-empty shell command, e.g. "
                             "--setup 'pip install -r requirements.txt'")
        out.append(value)
    return tuple(out)


# -- --resume: the resumed run's collected outputs, staged like a --data folder ---------------
RESUME_ENV = "GPUCLUSTER_RESUME_DIR"
RESUME_DEST = "resume"  # under the job's working directory on each node (ssh, aws)


def staged_mounts(job: JobSpec) -> tuple[DataMount, ...]:
    """What a launcher stages: the --data folders, then the --resume folder (`job.resume`)."""
    return tuple(job.data) + ((job.resume,) if job.resume is not None else ())


def staged_env(job: JobSpec, paths: Sequence[str]) -> dict[str, str]:
    """The environment for the folders of `staged_mounts(job)` at `paths` on a node."""
    env = data_env(paths[:len(job.data)])
    if job.resume is not None:
        env[RESUME_ENV] = paths[len(job.data)]
    return env


def data_env(paths: Sequence[str]) -> dict[str, str]:
    """GPUCLUSTER_DATA (the first) and GPUCLUSTER_DATA_DIRS (all) for the folders on a node."""
    if not paths:
        return {}
    return {"GPUCLUSTER_DATA": paths[0], "GPUCLUSTER_DATA_DIRS": os.pathsep.join(paths)}


# -- manifest ----------------------------------------------------------------------------------
def manifest(src: str) -> list[dict]:
    """Every regular file under `src` (symlinks followed, like a copy would): path relative to it,
    sha256, size, mode bits. Sorted by path."""
    files = []
    for root, dirnames, filenames in os.walk(src, followlinks=True):
        dirnames.sort()
        for name in sorted(filenames):
            full = os.path.join(root, name)
            st = os.stat(full)
            if not os.path.isfile(full):
                continue
            h = hashlib.sha256()
            with open(full, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            rel = os.path.relpath(full, src).replace(os.sep, "/")
            files.append({"path": rel, "sha256": h.hexdigest(), "size": st.st_size, "mode": st.st_mode & 0o755})
    return files


# -- setup wrapper -----------------------------------------------------------------------------
def _record(kind: str, key: str | None = None, **fields: str) -> str:
    """A printf writing one metric record; `fields` are JSON keys -> shell expressions (numbers);
    `key`: the shell variable holding the record's key (gpucluster.watch.control), when keyed."""
    fmt = "@gpucluster-metric " + json.dumps({"kind": kind})[:-1]
    fmt += "".join(f', "{k}": %s' for k in fields) + (', "key": "%s"' if key else "") + "}\\n"
    values = [*fields.values(), *([f"${key}"] if key else [])]
    return "printf " + shlex.quote(fmt) + "".join(f' "{v}"' for v in values)


def setup_wrapped(argv: Sequence[str], setup: Sequence[str], go_file: str, staged_file: str | None = None,
                  keyed: bool = False) -> list[str]:
    """`sh -c WRAPPER sh ARGV...`: run the setup commands (each by `sh -c`, output marked in the node
    log), print a `setup_end` record, wait for `go_file`, then exec ARGV (torchrun). Unchanged when
    there is no setup and no `staged_file`. The node's working directory and environment are the job's.

    `staged_file` (a node the launcher stages data into while it runs, e.g. a Kubernetes pod): the
    wrapper first waits for that file, which the launcher makes once the node's data is in place;
    without setup commands it then execs ARGV at once (no setup records, no go file).

    `keyed` (the wrapper runs under `reaper.py --keyed`): it first reads its two keys from its stdin
    into shell variables (never exported: no setup command sees them), then stdin is /dev/null."""
    wait_staged = [f"while [ ! -e {shlex.quote(staged_file)} ]; do sleep 0.2; done"] if staged_file else []
    if not setup:
        if not wait_staged:
            return list(argv)
        return ["sh", "-c", "\n".join([*wait_staged, 'exec "$@"']), "gpucluster-stage", *argv]
    n = len(setup)
    keys = ["IFS=' ' read -r gk_ss gk_se; exec </dev/null"] if keyed else []
    ks, ke = ("gk_ss", "gk_se") if keyed else (None, None)
    lines = [*keys, *wait_staged, "t0=$(date +%s)", _record(SETUP_START, ks)]
    for i, cmd in enumerate(setup, 1):
        lines.append("printf '%s\\n' " + shlex.quote(f"[gpucluster setup {i}/{n}] $ {cmd}"))
        lines.append(f"sh -c {shlex.quote(cmd)} </dev/null 2>&1; rc=$?")
        lines.append("if [ $rc -ne 0 ]; then "
                     f"printf '%s\\n' \"[gpucluster setup {i}/{n}] failed: exit code $rc\"; "
                     f"{_record(SETUP_END, ke, rc='$rc', command=str(i), seconds='$(( $(date +%s) - t0 ))')}; "
                     "exit $rc; fi")
    lines.append("printf '%s\\n' \"[gpucluster setup] done in $(( $(date +%s) - t0 )) s\"")
    lines.append(_record(SETUP_END, ke, rc="0", seconds="$(( $(date +%s) - t0 ))"))
    lines.append(f"while [ ! -e {shlex.quote(go_file)} ]; do sleep 0.2; done")
    lines.append('exec "$@"')
    return ["sh", "-c", "\n".join(lines), "gpucluster-setup", *argv]
