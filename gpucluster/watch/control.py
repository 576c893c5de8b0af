"""Control records: the metric records that gpucluster's own node programs print on a node's output
stream and that gpucluster acts on. They share that stream with the job's own output, so a job
could print the same lines; these keys make sure it cannot be believed when it does.

- `reaper_start` / `reaper_done` (gpucluster/node/reaper.py): the node's witness; a node whose reaper
  started but never said its final pass was over gets "not verified";
- `agent_exit` (the reaper's watch process, gpucluster/node/reaper.py): the node's agent has ended, so
  its reaper must say `reaper_done` within its grace, or it is taken for stopped (a job can SIGSTOP
  it), stopped, and the node has no witness;
- `node_exit` (the ssh node's shell, after the reaper): the node's job is over, so a session that
  something the job left holds open may be cut;
- `setup_start` / `setup_end` (the --setup wrapper, `staging.setup_wrapped`): every node's
  `setup_end` rc 0 releases the rendezvous;
- `node_notice` (the launcher's watcher beside an ssh node's job, e.g. infra/aws/node_notice.py):
  the cloud takes the node back, so the run ends and may be recovered on new machines.

Each of these carries a one-time key (`"key": ...`), one per node and kind, made here for the run
(`NodeKeys.new`) and given to the node program on its standard input, never on a command line or in
an environment (both of which the job can read in /proc): the reaper (`reaper.py --keyed`) reads
its line before it starts the job, then hands the setup wrapper its keys on a pipe that the wrapper
reads into shell variables before any setup command runs; the ssh node's shell reads its own
(`node_exit`) the same way, and pipes the watcher its `node_notice` key. The keys then live only in those processes' memory. `Gate.admit` takes
a keyed record only with the node's key for that kind, and once (a copy of a line the node log
already shows is a replay, refused); a line without it is the job's own: counted as a refused
metric line, never acted on. (A job that reads its ancestors' memory, which needs ptrace rights
over them, e.g. kernel.yama.ptrace_scope 0, could find a key: printing lines is not enough.)

Records that only the launcher itself makes (`LAUNCHER_ONLY`: staging, resumed files, a moved
rendezvous port) never come from a node's stream: a line of those kinds is refused too.

`worker_start` is printed by the announcer inside the worker process, just before it becomes the
user's program: nothing that process holds can be kept from the program it becomes, so it carries
no key. It only moves the run's phase to "train" and tells --resume which node held global rank 0
(the job's own folders); it is taken only once the node's setup (if any) said, with its key, that
it ended, and with ranks within what was launched.
"""

from __future__ import annotations

import contextlib
import hmac
import secrets
import subprocess
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from gpucluster.states import JsonObject

KEY = "key"  # the field of a control record that carries its key
REAPER_START, REAPER_DONE = "reaper_start", "reaper_done"  # gpucluster.node.reaper.START_KIND, DONE_KIND
NODE_EXIT = "node_exit"
SETUP_START, SETUP_END = "setup_start", "setup_end"  # gpucluster.watch.staging.SETUP_START, SETUP_END
NODE_NOTICE = "node_notice"  # gpucluster.watch.nodeloss.NOTICE_KIND
AGENT_EXIT = "agent_exit"  # gpucluster.node.reaper.AGENT_KIND
KEYED = (REAPER_START, REAPER_DONE, NODE_EXIT, SETUP_START, SETUP_END, NODE_NOTICE, AGENT_EXIT)
LAUNCHER_ONLY = ("stage", "resume_files", "rdzv_port")  # the launcher's own records (events.on_metric)
WORKER_START = "worker_start"


@dataclass(frozen=True)
class NodeKeys:
    """One node's keys, one per keyed kind (128 random bits each, `secrets`)."""

    keys: Mapping[str, str]

    @classmethod
    def new(cls) -> "NodeKeys":
        return cls({kind: secrets.token_hex(16) for kind in KEYED})

    def reaper_line(self, setup: bool) -> bytes:
        """The line the reaper reads on its stdin (`reaper.py --keyed`): its own two keys, its watch
        process's (`agent_exit`), then the setup wrapper's, which it hands on to the wrapper."""
        kinds = (REAPER_START, REAPER_DONE, AGENT_EXIT) + ((SETUP_START, SETUP_END) if setup else ())
        return (" ".join(self.keys[k] for k in kinds) + "\n").encode()

    def shell_line(self, setup: bool) -> bytes:
        """The line an ssh node's shell reads first: its `node_exit` key, its watcher's `node_notice`
        key, then the reaper's line."""
        return f"{self.keys[NODE_EXIT]} {self.keys[NODE_NOTICE]} ".encode() + self.reaper_line(setup)


def new_keys(ranks: Iterable[int]) -> dict[int, NodeKeys]:
    return {int(r): NodeKeys.new() for r in ranks}


def give_keys(proc: subprocess.Popen, line: bytes) -> None:
    """A node's keys line to the stdin of the process just started for it (its reaper, or the ssh
    client whose remote shell reads it), then EOF. A process that already died gets none: its node
    then has no witness, which the verdict says."""
    if proc.stdin is None:
        return
    with contextlib.suppress(OSError):
        proc.stdin.write(line)
    with contextlib.suppress(OSError):
        proc.stdin.close()


@dataclass
class Gate:
    """Which control records a node's stream may carry. `keys` None: the launcher gives its node
    programs no keys (their records are taken as they come; launcher-only kinds never are)."""

    keys: Mapping[int, NodeKeys] | None = None
    used: set[tuple[int, str]] = field(default_factory=set)

    def admit(self, node_rank: int, record: JsonObject) -> str | None:
        """None when `record` may be acted on (its key is removed from it); else why not (one line)."""
        kind = record.get("kind")
        if kind in LAUNCHER_ONLY:
            return f"a {kind!r} record is gpucluster's own, never a node's line"
        if self.keys is None or kind not in KEYED:
            return None
        given = record.pop(KEY, None)
        node = self.keys.get(node_rank)
        want = node.keys.get(kind) if node is not None else None
        if want is None or not isinstance(given, str) or not hmac.compare_digest(given.encode(), want.encode()):
            return f"a {kind!r} record without gpucluster's key for node {node_rank} (the job's own line)"
        if (node_rank, kind) in self.used:
            return f"a second {kind!r} record for node {node_rank} (a copy of one already taken)"
        self.used.add((node_rank, kind))
        return None
