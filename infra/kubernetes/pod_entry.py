"""gpucluster: run torchrun with this pod's node rank (JOB_COMPLETION_INDEX or the operator's RANK).

The app container's command in every pod of a Kubernetes run (`python /gpucluster/entry.py`): this
file is shipped by content in the run's ConfigMap (`infra.kubernetes.plan`) and runs with the image's
python, standard library only. It picks this node's argv from argv.json (beside it) and runs it.

- GPUCLUSTER_PYTHON: the image's `python` on PATH (absolute), its folder first on PATH.
- With GPUCLUSTER_CODE_DIR (a user's script folder was shipped, read-only, at /gpucluster/user): the
  folder is copied there first (the pod's run folder, an emptyDir), the file GPUCLUSTER_SHIPPED_MARK
  is made, and the command runs from there, so the script's relative paths work and what it writes
  beside itself can be copied back (files newer than the mark: gpucluster/node/workdir.py).
- Without a control folder (GPUCLUSTER_CONTROL_DIR) it execs the argv.
- With one the argv runs as a child in its own process group: a file `stop` there (made by the
  launcher through the exec API) stops it (SIGTERM, then SIGKILL after STOP_GRACE_S, or after the
  seconds written in it: a notice's time to save). When it has
  ended the script writes its exit code to `exit_code` there, prints a `job_end` metric record with
  it and exits with it: the container's status then carries the node's exit code even if its log
  stream broke. The pod's second container (`pod_keeper.py`) keeps the pod running while the
  launcher copies the output folder out (exec needs a running container).
With GPUCLUSTER_SELF_KEEP=1 (a TrainJob's pod, which has no keeper container, and which the JobSet
webhook makes restartPolicy OnFailure, so a container that exits non-zero is rerun in place) the
script keeps the container running itself after the job_end record, as the keeper would (until the
file `collected`, or GPUCLUSTER_COLLECT_WAIT_S), and then exits 0.
SIGTERM/SIGINT (the pod is deleted) go to the child. With --setup the argv is the setup wrapper
(setup commands, setup_end record, wait for the go file, exec torchrun): a failed setup ends the
child with its code, and `stop` while it waits for the go file ends it too.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

STOP_GRACE_S = 15  # SIGTERM to the child's group, then SIGKILL


def lay_down(src, dest, mark):
    """The shipped script folder as regular, writable files in `dest`, then the mark (the job's own
    files are newer than it). The ConfigMap volume's files are links into a hidden folder: followed."""
    for top, dirs, names in os.walk(src, followlinks=True):
        dirs[:] = [d for d in dirs if not d.startswith("..")]  # the volume's own ..data folders
        rel = os.path.relpath(top, src)
        os.makedirs(os.path.join(dest, rel), exist_ok=True)
        for name in names:
            if not name.startswith(".."):
                shutil.copyfile(os.path.join(top, name), os.path.join(dest, rel, name))
    with open(mark, "w"):
        pass


def stop_grace(path):
    """The seconds the launcher's stop gives the ranks to save (written in the stop file after a notice;
    at least STOP_GRACE_S, at most an hour)."""
    try:
        with open(path) as f:
            return min(3600.0, max(float(STOP_GRACE_S), float(f.read().strip() or STOP_GRACE_S)))
    except (OSError, ValueError):
        return float(STOP_GRACE_S)


def main() -> None:
    rank = os.environ.get("JOB_COMPLETION_INDEX") or os.environ.get("RANK")
    if rank is None:
        sys.exit("gpucluster entry: neither JOB_COMPLETION_INDEX nor RANK is set")
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "argv.json")) as f:
        argv = json.load(f)[int(rank)]
    os.environ["GPUCLUSTER_NODE_RANK"] = str(int(rank))
    # the node's Python, as on the other backends: the image's `python` (what torchrun runs under), as an
    # absolute path, its folder first on PATH, so a wrapper (`bash run.sh`) or --setup gets the same one
    python = shutil.which("python")
    if python:
        python = os.path.abspath(python)
        os.environ["GPUCLUSTER_PYTHON"] = python
        os.environ["PATH"] = os.path.dirname(python) + os.pathsep + os.environ.get("PATH", "")
    code_dir = os.environ.get("GPUCLUSTER_CODE_DIR")
    if code_dir:
        here = os.path.dirname(os.path.abspath(__file__))  # /gpucluster: the script folder is its user/
        lay_down(os.path.join(here, "user"), code_dir, os.environ["GPUCLUSTER_SHIPPED_MARK"])
        os.chdir(code_dir)
    sys.stdout.flush()
    control = os.environ.get("GPUCLUSTER_CONTROL_DIR")
    if not control:
        os.execvp(argv[0], argv)
    os.makedirs(control, exist_ok=True)
    if os.environ.get("GPUCLUSTER_OUTPUT_DIR"):
        os.makedirs(os.environ["GPUCLUSTER_OUTPUT_DIR"], exist_ok=True)
    child = subprocess.Popen(argv, start_new_session=True)
    signalled = []

    def kill(sig):
        try:
            os.killpg(child.pid, sig)
        except OSError:
            pass

    def on_signal(sig, frame):
        signalled.append(sig)
        kill(signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    stopping, grace = None, STOP_GRACE_S
    while child.poll() is None:
        if stopping is None and (signalled or os.path.exists(os.path.join(control, "stop"))):
            stopping, grace = time.monotonic(), stop_grace(os.path.join(control, "stop"))
            kill(signal.SIGTERM)
        elif stopping is not None and time.monotonic() - stopping > grace:
            kill(signal.SIGKILL)
        time.sleep(0.2)
    code = child.returncode if child.returncode >= 0 else 128 - child.returncode
    tmp = os.path.join(control, ".exit_code")
    with open(tmp, "w") as f:
        f.write(f"{code}\n")
    os.replace(tmp, os.path.join(control, "exit_code"))
    print("@gpucluster-metric " + json.dumps({"kind": "job_end", "exit_code": code,
                                              "stopped": stopping is not None}), flush=True)
    if os.environ.get("GPUCLUSTER_SELF_KEEP") == "1":
        keep(control, signalled)
        sys.exit(0)
    sys.exit(code)


def keep(control, signalled):
    """Until the launcher's `collected` (collecting), at most GPUCLUSTER_COLLECT_WAIT_S, or a SIGTERM."""
    if os.environ.get("GPUCLUSTER_COLLECTING") != "1":
        return
    end = time.monotonic() + float(os.environ.get("GPUCLUSTER_COLLECT_WAIT_S") or 1800)
    while not signalled and time.monotonic() < end and not os.path.exists(os.path.join(control, "collected")):
        time.sleep(0.5)


if __name__ == "__main__":
    main()
