"""One launch's ssh connections: a private temporary folder (control sockets, known_hosts, the
cluster's key, mode 0600), one multiplexed ControlMaster per node, and the per-node operations the
launcher and the cleanup use (run a script, readiness check, ship a bundle, list/kill a run's
processes, remove run folders). Every remote command is a POSIX `sh -c` script built with
`shlex.quote`; local commands are argv lists."""

from __future__ import annotations

import enum
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, TypeVar

from gpucluster.errors import ConfigError, LaunchError, MissingDependency
from gpucluster.events import RunEvents
from gpucluster.states import JsonMapping, JsonObject
from gpucluster.watch.procs import piped

if TYPE_CHECKING:
    from gpucluster.domain import Cluster, Leftover, Node
    from gpucluster.watch.outputs import NodeOutputs

from .remote import NO_PYTHON_RC, PROCS_PY, READY_MARK, READY_PY, gpu_row  # gpu_row: part of this module's API

NO_OUTPUT_RC = 3  # collect: the node has no output folder
OWNER_FILE = ".gpucluster-owner"  # in each node's run folder: the installation id of the home that made it
NOT_OURS_RC = 4  # a run folder another owner marked: left alone
T = TypeVar("T")
R = TypeVar("R")


class NodeObjects(Protocol):
    """What the nodes run to pull `--data` URLs and push outputs (`infra.aws.s3.NodeTransfer`,
    `infra.gcp.gcs`): `script(python, "pull", URL, DEST)` / `script(python, "push", SRC, URL)`."""

    def script(self, python: str, mode: str, a: str, b: str) -> str: ...


class SshSettings(Protocol):
    """What the connection layer reads of its launcher (`launch.SshLauncher`): how the nodes are
    reached and what runs there. A Protocol, so that this module (and those beside it) import
    nothing of the launcher above them."""

    @property
    def ssh(self) -> str: ...
    @property
    def connect_timeout(self) -> int: ...
    @property
    def known_hosts(self) -> str | None: ...
    @property
    def identity(self) -> str | None: ...
    @property
    def ssh_options(self) -> tuple[str, ...]: ...
    @property
    def python(self) -> str: ...
    @property
    def grace(self) -> float: ...
    @property
    def data_cache(self) -> str: ...
    @property
    def objects(self) -> NodeObjects | None: ...
    @property
    def diagnose(self) -> Callable[[Cluster, Node], str | None] | None: ...


def owner_guard(folder: str, owner: str | None) -> str:
    """A shell prefix that stops (exit NOT_OURS_RC, naming the owner) when `folder` carries another
    owner's mark; nothing without an owner to compare (a folder without a mark goes by its path,
    which holds the run id)."""
    if not owner:
        return ""
    mark = shlex.quote(f"{folder}/{OWNER_FILE}")
    return (f"if [ -f {mark} ] && [ \"$(cat {mark})\" != {shlex.quote(owner)} ]; then "
            f"echo {shlex.quote(folder)}\" belongs to owner $(cat {mark}): left alone\" >&2; exit {NOT_OURS_RC}; fi; ")


def node_label(node: Node) -> str:
    """`user@host[:port]` of a node, as people type it."""
    host = f"[{node.host}]" if ":" in node.host and node.port != 22 else node.host
    return f"{node.user + '@' if node.user else ''}{host}{'' if node.port == 22 else f':{node.port}'}"


def known_hosts_name(node: Node) -> str:
    return node.host if node.port == 22 else f"[{node.host}]:{node.port}"


def sh(script: str) -> str:
    """A remote command that runs `script` with POSIX sh whatever the login shell is."""
    return "sh -c " + shlex.quote(script)


@dataclass
class NodeReadiness:
    rank: int
    label: str
    ok: bool
    problems: list[str] = field(default_factory=list)
    home: str | None = None
    python: str | None = None
    torch: str | None = None
    gpu_state: list[JsonObject] = field(default_factory=list)  # name, util %, mem_used/total MiB

    @property
    def gpus(self) -> int:
        return len(self.gpu_state)

    @property
    def gpu_names(self) -> list[str]:
        return [g["name"] for g in self.gpu_state]


# -- the connection ---------------------------------------------------------------------------
class Session:
    """Per-launch ssh state: a private temp dir (control sockets, known_hosts, key), masters."""

    def __init__(self, launcher: SshSettings, cluster: Cluster):
        self.launcher = launcher
        self.cluster = cluster
        self.nodes = tuple(cluster.nodes)
        self.tmp = ""
        self.base_opts: list[str] = []
        self.known_hosts_files: list[str] = []

    def __enter__(self) -> "Session":
        if not shutil.which(self.launcher.ssh):
            raise MissingDependency(f"the OpenSSH client {self.launcher.ssh!r} is not installed or not on PATH; "
                                    "install it (Debian/Ubuntu: apt-get install openssh-client)")
        self.tmp = tempfile.mkdtemp(prefix="gcssh-")  # short: control socket paths are limited
        try:
            self.base_opts = self._options()
        except BaseException:  # Ctrl-C included: the temporary folder is removed before it propagates
            shutil.rmtree(self.tmp, ignore_errors=True)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _options(self) -> list[str]:
        L = self.launcher
        opts = [
            "BatchMode=yes", "StrictHostKeyChecking=yes", "UpdateHostKeys=no", "CheckHostIP=no",
            f"ConnectTimeout={L.connect_timeout}", "ServerAliveInterval=5", "ServerAliveCountMax=3",
            f"ControlPath={self.tmp}/%C", "LogLevel=ERROR",
        ]
        pinned = [f"{known_hosts_name(n)} {k.strip()}" for n in self.nodes for k in (n.host_keys or ())]
        files = []
        if pinned:
            path = os.path.join(self.tmp, "known_hosts")
            Path(path).write_text("\n".join(pinned) + "\n")
            files.append(path)
        if L.known_hosts:
            kh = os.path.abspath(os.path.expanduser(L.known_hosts))
            if not os.path.isfile(kh):
                raise ConfigError(f"known_hosts file {L.known_hosts!r} does not exist; "
                                  "give an OpenSSH known_hosts file with the nodes' host keys")
            files.append(kh)
        elif not pinned or not all(n.host_keys for n in self.nodes):
            files.append(os.path.expanduser("~/.ssh/known_hosts"))
        self.known_hosts_files = files
        opts.append("UserKnownHostsFile=" + " ".join(f'"{f}"' if " " in f else f for f in files))
        if pinned or L.known_hosts:
            opts.append("GlobalKnownHostsFile=/dev/null")
        identity = L.identity
        if identity:
            identity = os.path.abspath(os.path.expanduser(identity))
            if not os.path.isfile(identity):
                raise ConfigError(f"ssh identity file {L.identity!r} does not exist")
        elif self.cluster.ssh_private_key:
            fd, identity = tempfile.mkstemp(dir=self.tmp, prefix="id-")
            with os.fdopen(fd, "w") as f:
                f.write(self.cluster.ssh_private_key.rstrip("\n") + "\n")
        if identity:
            opts += ["IdentitiesOnly=yes", f"IdentityFile={identity}"]
        out: list[str] = []
        for o in [*L.ssh_options, *opts]:  # the first value of an option wins: user options first
            out += ["-o", o]
        return out

    def argv(self, node: Node, remote: str | None, *extra: str) -> list[str]:
        dest = f"{node.user}@{node.host}" if node.user else node.host
        argv = [self.launcher.ssh, *self.base_opts, "-p", str(node.port), *extra, "--", dest]
        return argv + ([remote] if remote is not None else [])

    def each(self, fn: Callable[[Node], tuple[T, str | None]]) -> list[tuple[T | None, str | None]]:
        """fn(node) on every node in parallel; results in node order. Exceptions become (None, msg)."""
        def safe(node: Node) -> tuple[T | None, str | None]:
            try:
                return fn(node)
            except LaunchError as exc:
                return None, str(exc)
        return self.map(safe)

    def map(self, fn: Callable[[Node], R]) -> list[R]:
        """fn(node) on every node in parallel; results in node order."""
        with ThreadPoolExecutor(max_workers=min(16, len(self.nodes)) or 1) as pool:
            return list(pool.map(fn, self.nodes))

    def run(self, node: Node, script: str, *, stdin: bytes | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[bytes]:
        """Run `sh -c script` on a node; LaunchError naming the node when ssh itself fails."""
        argv = self.argv(node, sh(script), "-o", "ControlMaster=no", "-T")
        try:
            cp = subprocess.run(argv, input=stdin if stdin is not None else b"", capture_output=True,
                                timeout=timeout + self.launcher.connect_timeout, start_new_session=True)
        except subprocess.TimeoutExpired:
            raise LaunchError(f"node {node.rank} ({node_label(node)}): no answer within "
                              f"{timeout + self.launcher.connect_timeout:g} s") from None
        if cp.returncode == 255:
            raise LaunchError(self.explain(node, cp.stderr.decode("utf-8", "replace")))
        return cp

    def explain(self, node: Node, stderr: str) -> str:
        """A one-line reason for an ssh connection failure, naming the node."""
        who = f"node {node.rank} ({node_label(node)})"
        low = stderr.lower()
        files = ", ".join(self.known_hosts_files)
        if ("host key verification failed" in low or "host key is known" in low
                or "remote host identification has changed" in low):
            kh = known_hosts_name(node)
            return (f"{who}: host key refused: no matching key for {kh} in {files}; refusing to connect. "
                    f"Verify the host's key fingerprint and add it to the file "
                    f"(e.g. ssh-keyscan -p {node.port} {node.host} >> FILE after checking it)")
        if "permission denied" in low:
            return (f"{who}: ssh authentication failed for user {node.user or '(default)'} "
                    "(give the key with --identity, or load it into ssh-agent; passwords are not used)")
        last = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        return f"{who}: cannot connect over ssh: {last[-1] if last else 'ssh exited with code 255'}"

    def wait_ready(self, ready_file: str, timeout: float, events: RunEvents, *,
                   first_delay: float = 1.0, max_delay: float = 15.0) -> None:
        """Until every node answers over ssh AND its ready marker (JSON written by user data after
        the driver/GPU/torch check) exists: retry each node with exponential backoff, progress on
        the status line. LaunchError naming each node that was not ready by `timeout` seconds,
        with what was last seen (and the launcher's `diagnose` text), or at once when a marker
        says ok=false. The wait is a state machine (`ReadyWait`)."""
        if not re.match(r"^/[A-Za-z0-9._/-]+$", ready_file):
            raise LaunchError(f"ready file {ready_file!r} from the stack outputs is not a plain absolute path")
        ReadyWait(self, ready_file, timeout, events, first_delay, max_delay).run()

    def open_master(self, node: Node) -> None:
        argv = self.argv(node, None, "-o", "ControlMaster=yes", "-o", "ControlPersist=300", "-N", "-f")
        with tempfile.TemporaryFile() as err:
            try:
                rc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err,
                                    timeout=self.launcher.connect_timeout + 30, start_new_session=True).returncode
            except subprocess.TimeoutExpired:
                raise LaunchError(f"node {node.rank} ({node_label(node)}): ssh connection timed out") from None
            if rc != 0:
                err.seek(0)
                raise LaunchError(self.explain(node, err.read().decode("utf-8", "replace")))

    def readiness(self, gpus_expected: int, *, raise_on_problem: bool) -> list[NodeReadiness]:
        py = shlex.quote(self.launcher.python)
        check = f"command -v {py} >/dev/null 2>&1 || exit {NO_PYTHON_RC}; exec {py} - {int(gpus_expected or 0)}"

        def one(node: Node) -> NodeReadiness:
            r = NodeReadiness(node.rank, node_label(node), ok=False)
            try:
                self.open_master(node)
                cp = self.run(node, check, stdin=READY_PY.encode(), timeout=180)
            except LaunchError as exc:
                r.problems.append(str(exc).split(": ", 1)[1] if str(exc).startswith("node ") else str(exc))
                return r
            if cp.returncode == NO_PYTHON_RC:
                r.problems.append(f"{self.launcher.python} not found on the remote PATH")
                return r
            lines = [ln for ln in cp.stdout.decode("utf-8", "replace").splitlines() if ln.startswith(READY_MARK)]
            if not lines:
                tail = cp.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit code {cp.returncode}"]
                r.problems.append(f"readiness check failed: {tail[0]}")
                return r
            try:
                info = json.loads(lines[-1][len(READY_MARK):])
            except ValueError:
                r.problems.append("readiness check printed an unreadable answer")
                return r
            r.home, r.python, r.torch = info.get("home"), info.get("python"), info.get("torch")
            r.gpu_state = [gpu_row(line) for line in info.get("gpus") or []]
            if "torch_error" in info:
                r.problems.append(f"torch is not importable by {self.launcher.python} {r.python} ({info['torch_error']}); "
                                  "install it on the node, e.g. pip install torch")
            for tool in ("setsid", "tar"):
                if not info.get(tool):
                    r.problems.append(f"{tool} not found on the remote PATH")
            if gpus_expected:
                if "gpu_error" in info:
                    r.problems.append(info["gpu_error"])
                elif r.gpus < gpus_expected:
                    r.problems.append(f"{r.gpus} GPU(s) visible to nvidia-smi, expected {gpus_expected}")
            r.ok = not r.problems
            return r

        results = self.map(one)  # `one` answers for every node (a LaunchError is its problem)
        bad = [r for r in results if not r.ok]
        if bad and raise_on_problem:
            detail = "; ".join(f"node {r.rank} ({r.label}): {', '.join(r.problems)}" for r in bad)
            raise LaunchError(f"{len(bad)} of {len(results)} node(s) not ready: {detail}")
        return results

    def mark_owner(self, owner: str | None) -> None:
        """The control folder carries the owner of the run (OWNER_FILE): `down` from another home
        leaves its masters and clients alone (`cleanup.close_local_ssh`)."""
        if owner and self.tmp:
            Path(self.tmp, OWNER_FILE).write_text(owner + "\n")

    def ship(self, bundle: bytes, dirs: dict[int, str], make: dict[int, str] | None = None,
             owner: str | None = None) -> None:
        """Unpack the bundle into each node's run folder, marked with `owner` (OWNER_FILE); `make`: a
        folder per node to create too (the output folder, so that it exists from here on, before
        anything runs). A folder already there that another owner marked is left alone (refused)."""
        def one(node: Node) -> tuple[None, str | None]:
            d = shlex.quote(dirs[node.rank])
            extra = f" && mkdir -p {shlex.quote(make[node.rank])}" if make and node.rank in make else ""
            mark = f" && printf '%s\\n' {shlex.quote(owner)} > {d}/{OWNER_FILE}" if owner else ""
            cp = self.run(node, f"umask 077 && {owner_guard(dirs[node.rank], owner)}rm -rf {d} && mkdir -p {d}{mark} "
                                f"&& tar -xf - -C {d}{extra}", stdin=bundle, timeout=300)
            if cp.returncode != 0:
                return None, (f"node {node.rank} ({node_label(node)}): copying the job files failed: "
                              + cp.stderr.decode("utf-8", "replace").strip()[-300:])
            return None, None

        errors = [err for _, err in self.each(one) if err]
        if errors:
            raise LaunchError("; ".join(errors))

    def touch(self, node: Node, path: str) -> tuple[None, str | None]:
        """(None, problem or None): create an empty file on a node."""
        try:
            cp = self.run(node, f"touch {shlex.quote(path)}", timeout=30)
        except LaunchError as exc:
            return None, str(exc)
        if cp.returncode != 0:
            return None, f"node {node.rank} ({node_label(node)}): touch failed: " + cp.stderr.decode(
                "utf-8", "replace").strip()[-200:]
        return None, None

    def receive_tar(self, node: Node, script: str, dest: Path) -> tuple[JsonObject, str | None, int, str]:
        """Run `script` on the node over this session's master connection and unpack the tar it
        writes to stdout into `dest` (`gpucluster.watch.outputs.extract_stream`: regular files and
        folders only). (tally {files, bytes, refused}, why the stream broke or None, the remote
        exit code, its stderr)."""
        from gpucluster.ledger.node_output import grow_pipe
        from gpucluster.watch.outputs import extract_stream

        tally: JsonObject = {"files": 0, "bytes": 0, "refused": []}
        broken = None
        with tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(self.argv(node, sh(script), "-o", "ControlMaster=no", "-T"),
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                    start_new_session=True, bufsize=1 << 20)
            stdout = piped(proc.stdout)
            grow_pipe(stdout)  # ssh goes on receiving while a piece is written to disk here
            try:
                try:
                    extract_stream(stdout, dest, tally)
                except (OSError, tarfile.TarError) as exc:
                    broken = f"the copy stopped after {tally['files']} file(s): {exc}"
                    while stdout.read(1 << 20):  # the sender must not block on a full pipe
                        pass
            finally:
                stdout.close()
                try:
                    rc = proc.wait(timeout=self.launcher.connect_timeout + 30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    rc = proc.wait()
            err.seek(0)
            stderr = err.read().decode("utf-8", "replace")
        return tally, broken, rc, stderr

    def copy_outputs(self, node: Node, remote: str, dest: Path) -> NodeOutputs:
        """Stream `remote` (a folder on the node) into `dest` here: `tar -cf - .` over this
        session's master connection, unpacked by `gpucluster.watch.outputs.extract_stream`. Returns a
        `NodeOutputs` with the verdict: complete (tar and the unpacking both finished, nothing
        refused), partial (some files came back: what tar could not read or what was refused is
        named), failed (nothing came back, and why)."""
        from gpucluster.watch.outputs import COMPLETE, FAILED, PARTIAL, NodeOutputs

        who = f"node {node.rank} ({node_label(node)})"
        script = f"cd {shlex.quote(remote)} 2>/dev/null || exit {NO_OUTPUT_RC}; exec tar -cf - ."
        start = time.monotonic()
        tally, broken, rc, stderr = self.receive_tar(node, script, dest)
        took = time.monotonic() - start
        files, refused = tally["files"], tally["refused"]
        out = NodeOutputs(node.rank, str(dest), COMPLETE, files, tally["bytes"], took)
        if rc == NO_OUTPUT_RC:
            out.verdict, out.detail = FAILED, f"{who}: no output folder {remote} (it was removed)"
            return out
        missing: list[str] = []
        if rc == 255:
            missing.append(self.explain(node, stderr))
        elif rc != 0:
            lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
            missing.append(f"tar on the node exited with code {rc}" + (": " + "; ".join(lines[-5:]) if lines else ""))
        if broken:
            missing.append(broken)
        if refused:
            missing.append(f"{len(refused)} entr{'y' if len(refused) == 1 else 'ies'} refused: "
                           + "; ".join(refused[:5]) + (" ..." if len(refused) > 5 else ""))
        if missing:
            out.verdict = PARTIAL if files else FAILED
            out.detail = f"{who}: " + "; ".join(m.split(": ", 1)[1] if m.startswith(who) else m for m in missing)
        return out

    def procs(self, node: Node, mode: str, run_id: str, rank: str, pgid_file: str,
              grace: float, owner: str | None = None, inner: float = 0.0) -> tuple[dict[str, str], None]:
        """({pid: command line}, None): the run's processes on the node ("list"), or those that
        survived SIGKILL ("kill"); with `owner`, only those it started (by run id AND owner, see
        node_procs.py). `inner`: the node supervisor's grace for this stop, when longer than its own
        (reaper.py --grace-file). LaunchError naming the node when it cannot be asked."""
        args = " ".join(shlex.quote(a) for a in (mode, run_id, rank, pgid_file, str(grace), owner or "", f"{inner:g}"))
        cp = self.run(node, f"exec {shlex.quote(self.launcher.python)} - {args}", stdin=PROCS_PY.encode(), timeout=grace + 30)
        out = cp.stdout.decode("utf-8", "replace").strip().splitlines()
        if cp.returncode != 0 or not out:
            raise LaunchError(f"node {node.rank} ({node_label(node)}): process check failed: "
                              + (cp.stderr.decode("utf-8", "replace").strip()[-300:] or f"exit code {cp.returncode}"))
        try:
            data = json.loads(out[-1])
        except ValueError:
            raise LaunchError(f"node {node.rank} ({node_label(node)}): process check printed {out[-1][:200]!r}") from None
        return (data if mode == "list" else data.get("left", {})), None

    def kill_run(self, run_id: str, dirs: dict[int, str], owner: str | None = None,
                 grace: float | None = None) -> dict[int, str | None]:
        """Kill the run's processes (by run id AND owner) on every reachable node; {rank: problem or None}.
        `grace`: longer than the launcher's (a node's interruption notice: the ranks' time to save);
        the node supervisors then wait nearly as long (reaper.py --grace-file)."""
        from gpucluster.node.reaper import nested_grace

        usual = self.launcher.grace
        grace = usual if grace is None or grace <= usual else float(grace)
        inner = max(nested_grace(usual), grace - 2.0) if grace > usual else 0.0
        results = self.each(lambda n: self.procs(n, "kill", run_id, str(n.rank), f"{dirs[n.rank]}/pgid",
                                                 grace, owner, inner))
        problems: dict[int, str | None] = {}
        for node, (left, err) in zip(self.nodes, results):
            problems[node.rank] = err or (f"{len(left)} process(es) survived SIGKILL" if left else None)
        return problems

    def remove_dirs(self, dirs: dict[int, str], owner: str | None = None) -> set[int]:
        """Remove the run folders (never one another owner marked); the ranks where that was done
        (or there was none)."""
        def one(node: Node) -> tuple[bool, None]:
            d = dirs.get(node.rank)
            if d:
                cp = self.run(node, f"{owner_guard(d, owner)}rm -rf {shlex.quote(d)} && {remove_run_folder(d, owner)}",
                              timeout=60)
                return cp.returncode == 0, None
            return True, None

        return {n.rank for n, (ok, _err) in zip(self.nodes, self.each(one)) if ok}

    def close(self) -> None:
        """Close the master connections and delete the temporary directory (sockets, key)."""
        if not self.tmp:
            return
        for node in self.nodes:
            try:
                subprocess.run(self.argv(node, None, "-O", "exit"), stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10)
            except (subprocess.TimeoutExpired, OSError):
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp = ""


@dataclass
class HeldRun:
    """A run's connections and node folders, kept from the end of `SshLauncher.launch` to its
    `collect_outputs` (and `workdir_copy.push_workdirs`)."""

    session: Session
    dirs: dict[int, str]
    out_dirs: dict[int, str]
    cluster: Cluster
    events: RunEvents
    cwds: dict[int, str] = field(default_factory=dict)  # the job's working folder per node


# -- waiting for the nodes' ready markers ------------------------------------------------------
class WaitState(enum.Enum):
    """The states of `ReadyWait`: poll the nodes that are due, judge what is known, then sleep
    until the next is due (or fail: a marker says ok=false, or the deadline passed)."""

    POLL = "poll"
    JUDGE = "judge"
    TIMED_OUT = "timed out"
    SLEEP = "sleep"
    READY = "ready"


class ReadyWait:
    """`Session.wait_ready`'s wait, as a state machine: one step method per state, each returning
    the next state; `run` only dispatches until READY (or a step raises LaunchError)."""

    def __init__(self, session: Session, ready_file: str, timeout: float, events: RunEvents,
                 first_delay: float, max_delay: float) -> None:
        self.session, self.ready_file, self.timeout, self.events = session, ready_file, timeout, events
        self.max_delay = max_delay
        self.nodes = session.nodes
        self.start = time.monotonic()
        self.deadline = self.start + timeout
        self.last: dict[int, str] = {n.rank: "not tried yet" for n in self.nodes}
        self.done: dict[int, JsonObject] = {}
        self.delay: dict[int, float] = {n.rank: first_delay for n in self.nodes}
        self.due: dict[int, float] = {n.rank: self.start for n in self.nodes}

    def run(self) -> None:
        steps: dict[WaitState, Callable[[], WaitState]] = {
            WaitState.POLL: self.poll, WaitState.JUDGE: self.judge,
            WaitState.TIMED_OUT: self.timed_out, WaitState.SLEEP: self.sleep}
        state = WaitState.POLL
        while state is not WaitState.READY:
            state = steps[state]()

    def waiting(self) -> list[Node]:
        return [n for n in self.nodes if n.rank not in self.done]

    def poll_one(self, node: Node) -> None:
        """One node's ready marker: read into `done`, or what was seen into `last`."""
        ready_file = self.ready_file
        try:
            # GPUCLUSTER_STATE_DIR: the same override the user-data scripts honour (tests)
            cp = self.session.run(node, 'f=${GPUCLUSTER_STATE_DIR:+$GPUCLUSTER_STATE_DIR/ready}; '
                                        f'cat "${{f:-{ready_file}}}" 2>/dev/null || exit 3', timeout=30)
        except LaunchError as exc:
            text = str(exc)
            self.last[node.rank] = text.split(": ", 1)[1] if text.startswith("node ") else text
            return
        if cp.returncode == 3:
            self.last[node.rank] = f"sshd answers; {ready_file} not written yet (user data still running)"
            return
        try:
            marker = json.loads(cp.stdout.decode("utf-8", "replace").strip().splitlines()[-1])
        except (ValueError, IndexError):
            self.last[node.rank] = f"{ready_file} is unreadable"
            return
        self.done[node.rank] = marker

    def poll(self) -> WaitState:
        """POLL: every node not ready whose turn has come, in parallel; each still not ready backs off."""
        now = time.monotonic()
        todo = [n for n in self.waiting() if self.due[n.rank] <= now]
        if todo:
            with ThreadPoolExecutor(max_workers=min(16, len(todo))) as pool:
                list(pool.map(self.poll_one, todo))
            now = time.monotonic()
            for n in todo:
                if n.rank not in self.done:
                    self.due[n.rank] = now + self.delay[n.rank]
                    self.delay[n.rank] = min(self.max_delay, self.delay[n.rank] * 2)
        return WaitState.JUDGE

    def judge(self) -> WaitState:
        """JUDGE: a marker with ok=false fails the wait at once; every node ready ends it; else the
        progress line, then TIMED_OUT past the deadline or SLEEP."""
        failed = {r: m for r, m in self.done.items() if not m.get("ok")}
        if failed:
            raise LaunchError("; ".join(_not_ready(self.nodes[r], m) for r, m in sorted(failed.items())))
        done, total = len(self.done), len(self.nodes)
        if done == total:
            self.events.progress(f"all {done} node(s) ready after {time.monotonic() - self.start:.0f} s")
            return WaitState.READY
        first = self.waiting()[0]
        self.events.progress(f"waiting for nodes: {done}/{total} ready, {time.monotonic() - self.start:.0f} s; "
                             f"node {first.rank}: {self.last[first.rank]}")
        return WaitState.TIMED_OUT if time.monotonic() >= self.deadline else WaitState.SLEEP

    def timed_out(self) -> WaitState:
        """TIMED_OUT: LaunchError naming every node not ready, with what was last seen."""
        raise LaunchError("; ".join(self.late(n) for n in self.waiting()))

    def late(self, n: Node) -> str:
        part = (f"node {n.rank} ({node_label(n)}, {n.instance_id or 'no id'}) "
                f"not ready after {self.timeout:g} s; last seen: {self.last[n.rank]}")
        diagnose = self.session.launcher.diagnose
        if diagnose is not None:
            try:
                extra = diagnose(self.session.cluster, n)
            except Exception as exc:  # noqa: BLE001 - help text only
                extra = f"(console output unavailable: {exc})"
            if extra:
                part += f"; {extra}"
        return part

    def sleep(self) -> WaitState:
        """SLEEP: until the next node is due (or the deadline), then POLL."""
        next_due = min(self.due[n.rank] for n in self.waiting())
        time.sleep(max(0.05, min(next_due, self.deadline) - time.monotonic()))
        return WaitState.POLL


def _not_ready(node: Node, m: JsonMapping) -> str:
    """A node whose ready marker says ok=false, with what its check found."""
    return (f"node {node.rank} ({node_label(node)}) is not ready: its check says "
            f"{m.get('gpus')} of {m.get('expected_gpus')} GPU(s), torch {m.get('torch') or 'missing'}"
            + (f", error: {m['error']}" if m.get("error") else ""))


# -- a run's folder on each host ----------------------------------------------------------------
# (`~/.gpucluster/runs/RUN`, holding the node folders): removed as a whole at teardown (what a
# --setup or the job wrote beside the node folders, e.g. Lightning's `<script dir>/../../Datasets`,
# is the run's too), and looked for by the teardown check (issue 46 item 7).
def remove_run_folder(node_dir: str, owner: str | None) -> str:
    """Shell text that removes the run folder holding `node_dir` (RUN/node-N) as a whole: what a
    --setup or the job wrote beside the node folders (`../../Datasets`) is the run's too. Left when
    another owner's node folder is in it."""
    if not os.path.basename(node_dir.rstrip("/")).startswith("node-"):
        return "true"
    parent = os.path.dirname(node_dir.rstrip("/"))
    q = shlex.quote(parent)
    other = (f"for m in {q}/node-*/{OWNER_FILE}; do [ -f \"$m\" ] && [ \"$(cat \"$m\")\" != {shlex.quote(owner)} ] "
             "&& exit 0; done; ") if owner else ""
    return f"{{ {other}rm -rf {q}; true; }}"


def folder_left(session: Session, node: Node, folder: str) -> str | None:
    """`folder` on the node when it still exists ('~/' is the remote home): its path and first
    names, for the teardown check; None when it is gone."""
    path = '"$HOME"/' + shlex.quote(folder[2:]) if folder.startswith("~/") else shlex.quote(folder)
    cp = session.run(node, f"d={path}; if [ -e \"$d\" ] || [ -L \"$d\" ]; then echo \"$d\"; "
                        "ls -A \"$d\" 2>/dev/null | head -4; fi", timeout=30)
    if cp.returncode != 0:
        raise LaunchError(f"node {node.rank} ({node_label(node)}): could not look for {folder}: "
                          + cp.stderr.decode("utf-8", "replace").strip()[-200:])
    lines = cp.stdout.decode("utf-8", "replace").splitlines()
    return f"{lines[0]} (holds {', '.join(lines[1:]) or 'nothing'})" if lines else None


def folder_leftover(node: Node, left: str) -> Leftover:
    """A run folder still on a host (`folder_left`'s answer), as a teardown leftover."""
    from gpucluster.domain import Leftover

    return Leftover("folder", f"{node_label(node)}:{left.split(' (holds ')[0]}", detail=left)
