"""FAKE torchrun, run as `python -m torch.distributed.run ...` inside a fake pod (the pod's python shim,
tests/k8s_fake_pod.py, sends that module here). It keeps what the launcher relies on from torchrun
and nothing of its training: the c10d rendezvous on the head, then the node's part of the job.

Rendezvous (PyTorch docs, "torchrun (Elastic Launch)": with `--rdzv-backend=c10d` the agent whose
`--rdzv-conf` says `is_host=true` hosts the store on `--rdzv-endpoint`, and no worker starts until
`--nnodes` agents have joined): the head listens on the endpoint's port (registered in the fake pod
network for each of its pod's DNS names, tests/k8s_fake_net.py) and answers `go` to every agent once
all `nnodes - 1` others have said `join`; the others connect to it and wait for `go`. An agent that
cannot join within the rendezvous's `join_timeout` exits 1, as torchrun does.

Then, per the pod's script (GPUCLUSTER_FAKE_SCRIPT, a JSON file the fake writes from `PodScript`):
`program: true` runs the job's program as this node's `--nproc-per-node` workers with torchrun's
worker environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT: the
head chooses the port and says it with `go`, as the c10d store tells every agent the master's address;
the fake pods all share this machine, so the address is 127.0.0.1) and exits with the first failing
worker's code; otherwise it writes `outputs` into
GPUCLUSTER_OUTPUT_DIR, prints `lines`, runs `run_s` seconds (forever when `exit_code` is null) and
exits with `exit_code`. SIGTERM ends it (the entry script's stop), as it ends torchrun.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time


def arg(argv: list[str], name: str, default: str | None = None) -> str | None:
    for i, a in enumerate(argv):
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
    return default


def split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(torchrun's options, the program and its arguments)."""
    for i, a in enumerate(argv):
        if not a.startswith("-"):
            prev = argv[i - 1] if i else ""
            if prev.startswith("--") and "=" not in prev and prev not in ("--standalone", "--no-python",
                                                                          "--module", "--no_python"):
                continue
            return argv[:i], argv[i:]
    return argv, []


def register(port_dir: str, names: list[str], port: int, local: int) -> list[str]:
    os.makedirs(port_dir, exist_ok=True)
    made = []
    for name in names:
        path = os.path.join(port_dir, f"{name}:{port}")
        fd, tmp = tempfile.mkstemp(dir=port_dir)
        with os.fdopen(fd, "w") as f:
            f.write(str(local))
        os.replace(tmp, path)
        made.append(path)
    return made


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rendezvous(opts: list[str]) -> int:
    """The master port every worker of the job uses, once every agent joined."""
    nnodes = int((arg(opts, "--nnodes") or "1").split(":")[-1])
    host, _, port = (arg(opts, "--rdzv-endpoint") or "localhost:29400").rpartition(":")
    conf = dict(kv.split("=", 1) for kv in (arg(opts, "--rdzv-conf") or "").split(",") if "=" in kv)
    timeout = float(conf.get("join_timeout", 600))
    if os.environ.get("GPUCLUSTER_FAKE_FAST_CLOCK"):
        timeout = min(timeout, 60.0)
    if nnodes <= 1:
        return free_port()
    if conf.get("is_host") == "true":
        server = socket.socket()
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        names = [n for n in os.environ.get("GPUCLUSTER_FAKE_DNS", "").split(",") if n]
        made = register(os.environ["GPUCLUSTER_FAKE_PORTS"], names, int(port), server.getsockname()[1])

        def gone(*_):
            for p in made:
                try:
                    os.unlink(p)
                except OSError:
                    pass

        import atexit

        atexit.register(gone)
        peers = []
        server.settimeout(timeout)
        while len(peers) < nnodes - 1:
            conn, _ = server.accept()
            if conn.recv(16).startswith(b"join"):
                peers.append(conn)
        master = free_port()
        for conn in peers:
            conn.sendall(f"go {master}\n".encode())
        return master
    end = time.monotonic() + timeout
    while True:
        try:
            conn = socket.create_connection((host, int(port)), timeout=5)
            break
        except OSError:
            if time.monotonic() > end:
                sys.exit(f"fake torchrun: rendezvous at {host}:{port} timed out after {timeout:g} s")
            time.sleep(0.05)
    conn.sendall(b"join\n")
    conn.settimeout(timeout)
    answer = conn.recv(32)
    if not answer.startswith(b"go "):
        sys.exit("fake torchrun: the rendezvous closed")
    return int(answer.split()[1])


def workers(opts: list[str], program: list[str], master: int) -> int:
    nproc = int(arg(opts, "--nproc-per-node") or arg(opts, "--nproc_per_node") or "1")
    nnodes = int((arg(opts, "--nnodes") or "1").split(":")[-1])
    node = int(os.environ.get("GPUCLUSTER_NODE_RANK") or os.environ.get("JOB_COMPLETION_INDEX") or 0)
    procs = []
    for local in range(nproc):
        env = {**os.environ, "RANK": str(node * nproc + local), "LOCAL_RANK": str(local),
               "WORLD_SIZE": str(nnodes * nproc), "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": str(node),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master)}
        argv = [sys.executable, *program] if "--no-python" not in opts else program
        procs.append(subprocess.Popen(argv, env=env))
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c != 0), 0)


def main() -> None:
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    opts, program = split(sys.argv[1:])
    with open(os.environ["GPUCLUSTER_FAKE_SCRIPT"]) as f:
        script = json.load(f)
    master = rendezvous(opts)
    if script.get("program"):
        sys.exit(workers(opts, program, master))
    out = os.environ.get("GPUCLUSTER_OUTPUT_DIR")
    for rel, content in (script.get("outputs") or {}).items():
        path = os.path.join(out, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(bytes.fromhex(content))
    wait(script.get("first_output_s", 0.0))  # the workers start and import torch before they print
    for line in script.get("lines") or []:
        print(line, flush=True)
        wait(script.get("line_interval_s", 0.0))
    if script.get("exit_code") is None:
        wait(float("inf"))
    wait(script.get("run_s", 0.0))
    sys.exit(script["exit_code"])


def wait(seconds: float) -> None:
    """Real seconds (the fake network's fast clock shortens each sleep, not this)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(min(0.05, max(0.0, end - time.monotonic())))


if __name__ == "__main__":
    main()
