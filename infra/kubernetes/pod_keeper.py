"""gpucluster: keep the pod running for the launcher's exec calls.

The command of a pod's second container (`python /gpucluster/keeper.py`), beside the training
container, whenever the pod has a run folder (an emptyDir at /gpucluster-run shared by both):
Kubernetes runs exec only in a running container, and a pod stays Running while one of its
containers runs (Kubernetes docs, "Pod Lifecycle"). So the training container may end, and its
status say torchrun's exit code, while the launcher still stages data, releases --setup, stops
torchrun and copies the output folder out through this one. Standard library only; shipped in the
run's ConfigMap and run with the image's python.

It ends (exit 0) when the file `collected` exists in GPUCLUSTER_CONTROL_DIR; without collection
(GPUCLUSTER_COLLECTING unset) as soon as the training container wrote `exit_code` there; with it,
at most GPUCLUSTER_COLLECT_WAIT_S after that (no launcher came to copy); and on SIGTERM (the pod is
deleted).
"""
import os
import signal
import sys
import time


def main() -> None:
    control = os.environ["GPUCLUSTER_CONTROL_DIR"]
    collecting = os.environ.get("GPUCLUSTER_COLLECTING") == "1"
    wait_s = float(os.environ.get("GPUCLUSTER_COLLECT_WAIT_S") or 1800)
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    os.makedirs(control, exist_ok=True)
    ended = None
    while not os.path.exists(os.path.join(control, "collected")):
        if os.path.exists(os.path.join(control, "exit_code")):
            if not collecting:
                break
            ended = ended or time.monotonic()
            if time.monotonic() - ended > wait_s:
                break
        time.sleep(0.5)


if __name__ == "__main__":
    main()
