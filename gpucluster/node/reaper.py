"""The node-side supervisor: runs one command (a node's torchrun) as a Linux child subreaper and,
when the command ends or the supervisor is told to stop, stops every process the command left
behind.

    python reaper.py [--grace SECONDS] [--grace-file PATH] [--keyed] [--env-stdin] -- COMMAND [ARGS...]

Why: a training script can start a daemon that leaves its session and its parent and clears its
environment (`setsid -f env -i sleep 778`). Such a process carries no GPUCLUSTER_RUN_ID and has
no parent left in the run, so no environment or process-group search finds it. A child subreaper
(prctl(PR_SET_CHILD_SUBREAPER), Linux >= 3.4, see man 2 prctl) adopts every orphaned descendant
instead of init, so the daemon stays a descendant of this process and is found here.

Behaviour:
- becomes a subreaper (on a system without prctl it says so on stderr, once, and goes on: then
  only processes that keep a parent in the job are found);
- runs COMMAND as its child (same process group, same stdout/stderr, same environment);
- `--env-stdin`: reads one JSON object line from stdin (after the keys line, with `--keyed`),
  names to values, into COMMAND's environment, then gives COMMAND /dev/null as stdin (the ssh
  launcher sends the job's --env and --secret values this way: never on a command line, never in
  a file);
- on SIGTERM, SIGINT or SIGHUP: passes SIGTERM to COMMAND; if COMMAND has not ended after
  `--grace` seconds, every descendant gets SIGKILL; with `--grace-file`, a number of seconds in
  that file when the signal comes is the grace instead when it is longer (the launcher writes it
  before stopping a node that gave an interruption notice: the ranks get the notice's time to save);
- when COMMAND has ended: every remaining descendant gets SIGTERM, then SIGKILL after `--grace`
  seconds (after a stop with a longer grace, what is left of that one); what it stopped is
  written to stderr (one line, `gpucluster-reaper: ...`);
- exits with COMMAND's exit code (128 + N when COMMAND died of signal N);
- is its own witness: a metric record `reaper_start` once it adopts orphans, and `reaper_done`
  (stopped, survived) once its final pass is over. A node whose reaper started but never said
  it was done (the reaper was killed) cannot vouch for its processes: its verdict is not verified.
- with `--keyed`, a watch process (a fork of the reaper, beside COMMAND) says `agent_exit` (with
  COMMAND's exit status when it can read it) as soon as COMMAND has ended, whether or not the
  reaper could collect it: a job that stops its reaper (SIGSTOP) leaves COMMAND a zombie that
  nobody waits for, and the launcher, told so, gives the reaper its grace to say `reaper_done`,
  then stops it and counts the node as without a witness, instead of waiting for ever.
- with `--keyed`: before anything else it reads one line from its stdin, the run's keys for this
  node (gpucluster/watch/control.py): its own two, which its two records carry, then any others, which
  it hands to COMMAND as a line on a pipe that becomes COMMAND's stdin (the --setup wrapper reads
  them there); without such keys COMMAND's stdin is /dev/null. Either way nothing COMMAND starts can
  read what followed on the reaper's own stdin. The keys are never on a command line or in an
  environment.

Standard library only: it is copied to ssh nodes as it is and run by the nodes' Python.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from typing import NoReturn

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
PREFIX = "gpucluster-reaper: "
METRIC = "@gpucluster-metric "  # gpucluster.workloads.protocol.PREFIX (this file is standard library only)
START_KIND, DONE_KIND = "reaper_start", "reaper_done"
AGENT_KIND = "agent_exit"  # the watch process's record: COMMAND has ended (gpucluster.watch.control.AGENT_EXIT)


KEYS: dict = {}  # kind -> this node's key for it (--keyed)


def witness(kind: str, **fields: int) -> None:
    """One metric record on stderr (merged into the node's log and read by the supervisor), with
    its key when the reaper was given keys."""
    import json

    record = {"kind": kind, **fields}
    if kind in KEYS:
        record["key"] = KEYS[kind]
    try:
        print(METRIC + json.dumps(record), file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass


def read_keys() -> list[str]:
    """The keys line on stdin (read byte by byte: nothing after it is taken), as words (main then
    makes stdin /dev/null, so nothing started here can read what might follow)."""
    got = b""
    while not got.endswith(b"\n") and len(got) < 4096:
        try:
            b = os.read(0, 1)
        except OSError:
            break
        if not b:
            break
        got += b
    return got.decode("ascii", "replace").split()


def _stdin_line(words: list[str]) -> None:
    """In the child, before exec: stdin becomes a pipe holding `words` as one line (then EOF)."""
    r, w = os.pipe()
    os.write(w, (" ".join(words) + "\n").encode())  # far below a pipe's capacity: never blocks
    os.close(w)
    os.dup2(r, 0)
    os.close(r)


def nested_grace(launcher_grace: float) -> float:
    """The reaper's grace under a launcher's: it fits twice into the launcher's, so the reaper
    finishes its own pass before the launcher escalates to SIGKILL."""
    return max(0.5, min(2.0, launcher_grace / 3))


def stop_grace(grace: float, grace_file: str | None) -> float:
    """The grace for a stop that is starting now: the number in `grace_file` when it is there and
    longer (at most an hour), else `grace`."""
    if not grace_file:
        return grace
    try:
        with open(grace_file) as f:
            longer = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return grace
    return min(3600.0, longer) if longer > grace else grace


def become_subreaper() -> str | None:
    """None when this process is now a child subreaper; otherwise why it is not."""
    if not sys.platform.startswith("linux"):
        return f"child subreapers exist only on Linux (this is {sys.platform})"
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            return f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(err)}"
    except (OSError, AttributeError) as exc:
        return f"prctl is not available: {exc}"
    return None


def _ppids() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state letter) of every process, from /proc (empty without /proc)."""
    out: dict[int, tuple[int, str]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for d in names:
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                rest = f.read().rsplit(b")", 1)[1].split()
            out[int(d)] = (int(rest[1]), rest[0].decode())
        except (OSError, IndexError, ValueError):
            continue
    return out


def descendants(root: int) -> list[int]:
    """Live (non-zombie) descendants of `root`, parents before children."""
    table = _ppids()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _state) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return [p for p in found if table[p][1] != "Z"]


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:120]
    except OSError:
        return "?"


def _reap() -> None:
    """Collect every child that has ended (adopted orphans included), without blocking."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def stop_descendants(grace: float) -> tuple[list[str], list[int]]:
    """SIGTERM every descendant, SIGKILL what is left after `grace`; (what was found, survivors)."""
    me = os.getpid()
    first = descendants(me)
    seen = [f"pid {p} ({_cmdline(p)})" for p in first]
    if not first:
        return [], []
    _signal_all(first, signal.SIGTERM)
    end = time.monotonic() + grace
    left = first
    while time.monotonic() < end:
        _reap()
        left = descendants(me)
        if not left:
            return seen, []
        time.sleep(0.05)
    for _ in range(3):  # new ones may appear while killing (a daemon forking): kill until none
        left = descendants(me)
        if not left:
            break
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.1)
        _reap()
    return seen, descendants(me)


def _ended(pid: int) -> tuple[bool, int | None]:
    """(whether process `pid` has ended, its exit status as the reaper would give it, when /proc
    still holds it). An ended child that nobody has collected is a zombie whose /proc/PID/stat
    keeps the wait status in field 52, exit_code (proc(5), Linux >= 3.5)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
    except OSError:
        return True, None  # collected already (the reaper ran) or gone
    if rest[0] != b"Z":
        return False, None
    try:
        status = int(rest[49])
    except (IndexError, ValueError):
        return True, None
    return True, (status >> 8) & 0xFF if status & 0x7F == 0 else 128 + (status & 0x7F)


def _watch(child: int) -> int:
    """Fork the watch process: it says `agent_exit` once `child` has ended (then exits), or exits
    when the reaper has gone. Its pid (0 when it could not start: then nothing says it)."""
    try:
        pid = os.fork()
    except OSError:
        return 0
    if pid:
        return pid
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        key = KEYS.get(AGENT_KIND)
        KEYS.clear()
        KEYS[AGENT_KIND] = key
        reaper = os.getppid()
        while os.getppid() == reaper:
            ended, code = _ended(child)
            if ended:
                witness(AGENT_KIND, **({"rc": code} if code is not None else {}))
                break
            time.sleep(0.1)
    finally:
        os._exit(0)


MAX_ENV_LINE = 4 << 20  # bytes of the --env-stdin line


def env_from_stdin() -> str | None:
    """--env-stdin: one JSON line of name -> value from stdin into this process's environment (so
    COMMAND inherits it). None when done; otherwise why not (no value shown)."""
    import json

    try:
        line = sys.stdin.buffer.readline(MAX_ENV_LINE)
        env = json.loads(line.decode("utf-8")) if line.strip() else None
    except (OSError, ValueError) as exc:
        return f"--env-stdin: the environment line could not be read ({type(exc).__name__})"
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        return "--env-stdin: expected one JSON object of names to string values on stdin"
    os.environ.update(env)
    return None


class _Options:
    """The reaper's command line, read."""

    def __init__(self) -> None:
        self.grace = 2.0
        self.grace_file: str | None = None
        self.handed: list[str] = []  # the keys that are not the reaper's: COMMAND's stdin line
        self.command: list[str] = []


def _options(argv: list[str]) -> _Options | int:
    """The options, in their order (with --keyed and --env-stdin, their lines of stdin read, and
    stdin then closed to COMMAND); an exit status (2) when they are bad, said on stderr."""
    opts = _Options()
    args = list(argv)
    if args[:1] == ["--grace"] and len(args) >= 2:
        try:
            opts.grace = max(0.0, float(args[1]))
        except ValueError:
            print(PREFIX + f"--grace {args[1]!r} is not a number of seconds", file=sys.stderr)
            return 2
        args = args[2:]
    if args[:1] == ["--grace-file"] and len(args) >= 2:
        opts.grace_file, args = args[1], args[2:]
    rest = _stdin_options(args, opts)
    if isinstance(rest, int):
        return rest
    args = rest[1:] if rest[:1] == ["--"] else rest
    if not args:
        print(PREFIX + "usage: reaper.py [--grace SECONDS] [--grace-file PATH] [--keyed] [--env-stdin] -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    opts.command = args
    return opts


def _stdin_options(args: list[str], opts: _Options) -> list[str] | int:
    """--keyed (the keys line) and --env-stdin (the environment line), read from stdin in that
    order; then nothing started here can read what stdin may still hold. The arguments left, or
    an exit status (2)."""
    read_stdin = args[:1] in (["--keyed"], ["--env-stdin"])
    if args[:1] == ["--keyed"]:  # the keys line comes first on stdin, then (--env-stdin) the environment
        words = read_keys()
        KEYS.update(zip((START_KIND, DONE_KIND, AGENT_KIND), words))
        opts.handed = words[3:]
        args = args[1:]
    if args[:1] == ["--env-stdin"]:
        args = args[1:]
        problem = env_from_stdin()
        if problem:
            print(PREFIX + problem, file=sys.stderr, flush=True)
            return 2
    if read_stdin:  # nothing started here can read what stdin may still hold
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    return args


class _Stopper:
    """What the reaper does when told to stop: SIGTERM to COMMAND, then (once) the grace, after
    which every descendant gets SIGKILL."""

    def __init__(self, grace: float, grace_file: str | None) -> None:
        self.grace, self.grace_file = grace, grace_file
        self.child = 0
        self.stopping = False
        self.until = 0.0  # when stopped: the end of the grace COMMAND's workers keep after it ends

    def on_alarm(self, signum: int, frame: object) -> None:  # the command ignored SIGTERM for `grace` seconds
        _signal_all(descendants(os.getpid()), signal.SIGKILL)

    def on_stop(self, signum: int, frame: object) -> None:
        if self.child > 0:
            try:
                os.kill(self.child, signal.SIGTERM)
            except OSError:
                pass
        if not self.stopping:
            self.stopping = True
            given = stop_grace(self.grace, self.grace_file)
            self.until = time.monotonic() + given  # a COMMAND that ends early leaves its workers this long
            signal.signal(signal.SIGALRM, self.on_alarm)
            signal.setitimer(signal.ITIMER_REAL, max(given, 0.01))


def _run_command(opts: _Options) -> NoReturn:
    """In the forked child: COMMAND, with the signals as they were and its keys' line on stdin."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    KEYS.clear()
    try:
        if opts.handed:
            _stdin_line(opts.handed)
        os.execvp(opts.command[0], opts.command)
    except OSError as exc:
        print(PREFIX + f"cannot start {opts.command[0]!r}: {exc}", file=sys.stderr, flush=True)
    os._exit(127)


def _wait_for(child: int) -> int:
    """Reap until COMMAND ends (adopted orphans too); its exit status (128 + N for signal N)."""
    watch = _watch(child) if AGENT_KIND in KEYS else 0
    code = 1
    while True:
        try:
            pid, status = os.waitpid(-1, 0)  # adopted orphans are reaped here too
        except ChildProcessError:
            break
        if pid == watch:
            watch = 0
        if pid == child:
            code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
            break
    if watch:  # its work is done (the reaper reports now): never counted among what the job left
        _signal_all([watch], signal.SIGKILL)
        try:
            os.waitpid(watch, 0)
        except ChildProcessError:
            pass
    return code


def _final_pass(grace: float) -> None:
    """What COMMAND left is stopped (said on stderr), and the reaper's `reaper_done` record."""
    seen, survivors = stop_descendants(grace)
    if seen:
        print(PREFIX + f"stopped {len(seen)} process(es) the job left running: " + "; ".join(seen[:8])
              + (" ..." if len(seen) > 8 else ""), file=sys.stderr, flush=True)
    if survivors:
        print(PREFIX + f"{len(survivors)} process(es) survived SIGKILL: "
              + ", ".join(str(p) for p in survivors), file=sys.stderr, flush=True)
    witness(DONE_KIND, stopped=len(seen), survived=len(survivors))


def main(argv: list[str]) -> int:
    opts = _options(argv)
    if isinstance(opts, int):
        return opts
    why = become_subreaper()
    if why:
        print(PREFIX + f"cannot adopt orphaned processes ({why}); a process the job detaches "
              "from its parents is not found at teardown", file=sys.stderr, flush=True)
    else:
        witness(START_KIND)
    stopper = _Stopper(opts.grace, opts.grace_file)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, stopper.on_stop)
    try:
        child = os.fork()
    except OSError as exc:
        print(PREFIX + f"cannot start {opts.command[0]!r}: {exc}", file=sys.stderr)
        return 127
    if child == 0:
        _run_command(opts)
    stopper.child = child
    code = _wait_for(child)
    signal.setitimer(signal.ITIMER_REAL, 0)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)  # finish the pass, whatever arrives now
    # told to stop with a longer grace (a notice): what COMMAND left (torchrun's workers, still
    # saving when a second SIGTERM cut torchrun's own wait short) keeps the rest of it
    _final_pass(max(opts.grace, stopper.until - time.monotonic()))
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
