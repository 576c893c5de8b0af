"""`exec` on a kept ssh cluster against `run` on the same hosts (issue 46, done-means 2): what the
daily loop saves. Two real sshd hosts on loopback (tests/sshd.py), one trivial job (torch-free
script under the real torchrun agents: it prints a line and exits).

    python benchmarks/exec_vs_run.py [REPEATS]      (default 3)

Each repeat times, wall clock, what a user types:

    gpucluster run --cloud ssh --hosts H0,H1 --identity KEY --known-hosts FILE --remote-python PY --yes -- python job.py
    gpucluster exec lab -- python job.py      (after one `gpucluster up --cloud ssh ... --name lab`)

and the phases of each from `show --json`. Prints the medians and the ratio exec/run. Both pay the
CLI's start-up and the hosts' readiness questions (exec asks each host python, torch and its home
again, 1-2 s); `run` also records and checks the hosts, and tears down and checks the run at the end.
On this 2-core machine every torchrun agent shares the cores with sshd. Not a test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _util import BIN, ROOT, fresh_home_env, median, timed

sys.path.insert(0, str(ROOT / "tests"))
from sshd import SshdHosts, missing_reason  # noqa: E402

JOB = "import os\nprint('hello from rank', os.environ['RANK'], flush=True)\n"


def _phases(env: dict, run_id: str) -> dict[str, float]:
    shown = subprocess.run([str(BIN / "gpucluster"), "show", run_id, "--json"], capture_output=True, text=True,
                           env=env)
    data = json.loads(shown.stdout)
    return {p["name"]: round((p.get("ended_at") or 0) - (p.get("started_at") or 0), 2)
            for p in data.get("phases") or [] if p.get("ended_at")}


def _latest(env: dict) -> str:
    runs = subprocess.run([str(BIN / "gpucluster"), "runs", "--json"], capture_output=True, text=True, env=env)
    return json.loads(runs.stdout)[0]["id"]


def main() -> int:
    reason = missing_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    root = Path(tempfile.mkdtemp(prefix="gpucluster-exec-bench-"))
    hosts = SshdHosts.start(root, 2)
    project = root / "project"
    project.mkdir()
    (project / "job.py").write_text(JOB)
    env = fresh_home_env(COLUMNS="200")
    gc = str(BIN / "gpucluster")
    reach = ["--hosts", ",".join(hosts.hosts[:2]), "--identity", str(hosts.identity),
             "--known-hosts", str(hosts.known_hosts), "--remote-python", sys.executable]
    times: dict[str, list[float]] = {"run": [], "exec": []}
    phases: dict[str, list[dict[str, float]]] = {"run": [], "exec": []}
    try:
        up_s, up = timed([gc, "up", "--cloud", "ssh", *reach, "--name", "lab", "--yes"], env=env, cwd=project)
        if up.returncode != 0:
            print(up.stdout + up.stderr)
            return 1
        for _ in range(repeats):
            for kind, argv in (("run", [gc, "run", "--cloud", "ssh", *reach, "--yes", "--", "python", "job.py"]),
                               ("exec", [gc, "exec", "lab", "--", "python", "job.py"])):
                took, done = timed(argv, env=env, cwd=project)
                if done.returncode != 0:
                    print(f"{kind} failed (exit {done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
                    return 1
                times[kind].append(took)
                phases[kind].append(_phases(env, _latest(env)))
        subprocess.run([gc, "down", "lab", "--yes"], capture_output=True, env=env)
    finally:
        hosts.stop()
        shutil.rmtree(root, ignore_errors=True)
    print(f"up (once): {up_s:.1f} s")
    for kind in ("run", "exec"):
        mids = {p: median([ph.get(p, 0.0) for ph in phases[kind]]) for p in phases[kind][0]}
        print(f"{kind:5s} median {median(times[kind]):5.1f} s over {repeats} "
              f"({', '.join(f'{t:.1f}' for t in times[kind])}); phases: "
              + ", ".join(f"{p} {s:.1f}" for p, s in mids.items() if s >= 0.05))
    print(f"exec/run: {median(times['exec']) / median(times['run']):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
