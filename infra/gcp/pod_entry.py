"""gpucluster: run torchrun with this pod's node rank (JOB_COMPLETION_INDEX or the operator's RANK).

The app container's command in every pod of a Kubernetes run (`python /gpucluster/entry.py`): this
file is shipped by content in the run's ConfigMap (`infra.gcp.k8s_plan`) and runs with the image's
python, standard library only. It picks this node's argv from argv.json (beside it) and runs it.
Without a control folder (outputs not collected) it execs the argv. With one (GPUCLUSTER_CONTROL_DIR)
the argv runs as a child in its own process group so the container outlives it: a file `stop` there
(made by the launcher through the exec API) stops it (SIGTERM, then SIGKILL after STOP_GRACE_S); when
it has ended the script prints a `job_end` metric record with its exit code and waits, up to
GPUCLUSTER_COLLECT_WAIT_S, for a file `collected` there, so the pod is still Running while the launcher
copies its output folder out (exec needs a running container). SIGTERM/SIGINT (the pod is deleted) go
to the child and end the wait. The script exits with the child's code. With --setup the argv is the
setup wrapper (setup commands, setup_end record, wait for the go file, exec torchrun): a failed setup
ends the child with its code (job_end says it), and `stop` while it waits for the go file ends it too.
"""
import json
import os
import signal
import subprocess
import sys
import time

STOP_GRACE_S = 15  # SIGTERM to the child's group, then SIGKILL


def main() -> None:
    rank = os.environ.get("JOB_COMPLETION_INDEX") or os.environ.get("RANK")
    if rank is None:
        sys.exit("gpucluster entry: neither JOB_COMPLETION_INDEX nor RANK is set")
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "argv.json")) as f:
        argv = json.load(f)[int(rank)]
    os.environ["GPUCLUSTER_NODE_RANK"] = str(int(rank))
    sys.stdout.flush()
    control = os.environ.get("GPUCLUSTER_CONTROL_DIR")
    if not control:
        os.execvp(argv[0], argv)
    os.makedirs(control, exist_ok=True)
    os.makedirs(os.environ["GPUCLUSTER_OUTPUT_DIR"], exist_ok=True)
    wait_s = float(os.environ.get("GPUCLUSTER_COLLECT_WAIT_S") or 1800)
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
    stopping = None
    while child.poll() is None:
        if stopping is None and (signalled or os.path.exists(os.path.join(control, "stop"))):
            stopping = time.monotonic()
            kill(signal.SIGTERM)
        elif stopping is not None and time.monotonic() - stopping > STOP_GRACE_S:
            kill(signal.SIGKILL)
        time.sleep(0.2)
    code = child.returncode if child.returncode >= 0 else 128 - child.returncode
    print("@gpucluster-metric " + json.dumps({"kind": "job_end", "exit_code": code,
                                              "stopped": stopping is not None}), flush=True)
    end = time.monotonic() + wait_s
    while not signalled and time.monotonic() < end and not os.path.exists(os.path.join(control, "collected")):
        time.sleep(0.2)
    sys.exit(code)


if __name__ == "__main__":
    main()
