"""gpucluster idle stop on GKE (`up --idle-minutes N`), run in the cluster by the Deployment
`gpucluster-idle` on the system pool (infra/gcp/idle.py), with its own ServiceAccount whose Role
allows only: list pods in its namespace, get and patch the one Job `gpucluster-hold`.

The hold Job's pods (one per GPU node, no resources requested, annotated
cluster-autoscaler.kubernetes.io/safe-to-evict=false) keep the cluster autoscaler from removing the GPU
nodes. Every POLL seconds this program lists the pods of gpucluster jobs in its namespace (labels
app.kubernetes.io/managed-by=gpucluster and gpucluster-job) and:

- a job pod that is Pending or Running: the last job is now; the hold is raised to the number of GPU
  nodes the job's pods run on (never more: a hold pod that found no node would make the autoscaler add one);
- MINUTES without one, or the cluster's max lifetime passed (GPUCLUSTER_DEADLINE): the hold goes to
  parallelism 0 (its pods are deleted) and the autoscaler removes the empty GPU nodes after its own delay.

The time of the last job is kept on the hold Job (annotation gpucluster.io/idle-last-job), so a restart
of this program does not start the count again. It never deletes anything and never exits on an API
error (the next look tries again). Standard library only. GPUCLUSTER_API_URL, GPUCLUSTER_SA_DIR and
GPUCLUSTER_IDLE_SCALE (seconds per minute, 60) are for tests.
"""

import json
import os
import ssl
import sys
import time
import urllib.parse
import urllib.request

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
SELECTOR = "app.kubernetes.io/managed-by=gpucluster,gpucluster-job"
LAST = "gpucluster.io/idle-last-job"


class Api:
    def __init__(self):
        sa = os.environ.get("GPUCLUSTER_SA_DIR") or SA_DIR
        self.sa = sa
        url = os.environ.get("GPUCLUSTER_API_URL")
        if not url:
            host = os.environ["KUBERNETES_SERVICE_HOST"]
            url = "https://%s:%s" % ("[%s]" % host if ":" in host else host, os.environ.get("KUBERNETES_SERVICE_PORT", "443"))
        self.url = url.rstrip("/")
        ca = os.path.join(sa, "ca.crt")
        self.ctx = ssl.create_default_context(cafile=ca) if self.url.startswith("https") else None

    def call(self, method, path, body=None, content_type="application/json"):
        with open(os.path.join(self.sa, "token")) as fh:  # re-read: the kubelet rotates projected tokens
            token = fh.read().strip()
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method)
        req.add_header("Authorization", "Bearer " + token)
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", content_type)
        with urllib.request.urlopen(req, timeout=30, context=self.ctx) as resp:
            return json.loads(resp.read() or b"{}")


def active_nodes(pods):
    """(any job pod Pending or Running, the nodes such pods run on)."""
    active, nodes = False, set()
    for p in pods:
        meta, status = p.get("metadata") or {}, p.get("status") or {}
        if meta.get("deletionTimestamp") or status.get("phase") not in ("Pending", "Running"):
            continue
        active = True
        node = (p.get("spec") or {}).get("nodeName")
        if node:
            nodes.add(node)
    return active, nodes


def decide(now, last, minutes, scale, deadline, held, active, nodes, most):
    """(last job time, wanted hold parallelism, why) from one look."""
    if active:
        last = now
    if deadline and now >= deadline:
        return last, 0, "the cluster's max lifetime has passed"
    if active:
        return last, min(most, max(held, len(nodes))), None
    if now >= last + minutes * scale:
        return last, 0, "no gpucluster job for %g minutes" % minutes
    return last, held, None


def look(api, ns, hold, minutes, scale, deadline, most, last_seen):
    query = urllib.parse.urlencode({"labelSelector": SELECTOR})
    pods = api.call("GET", "/api/v1/namespaces/%s/pods?%s" % (ns, query))
    active, nodes = active_nodes(pods.get("items") or [])
    path = "/apis/batch/v1/namespaces/%s/jobs/%s" % (ns, hold)
    job = api.call("GET", path)
    held = int((job.get("spec") or {}).get("parallelism") or 0)
    noted = float(((job.get("metadata") or {}).get("annotations") or {}).get(LAST) or 0)
    now = time.time()
    last = max(noted, last_seen or 0) or now  # armed at the first look when nothing was noted
    last, wanted, why = decide(now, last, minutes, scale, deadline, held, active, nodes, most)
    if wanted != held or abs(last - noted) > 1e-3:
        patch = {"metadata": {"annotations": {LAST: "%.3f" % last}}}
        if wanted != held:
            patch["spec"] = {"parallelism": wanted}
        api.call("PATCH", path, patch, "application/merge-patch+json")
        if wanted != held:
            line = ("released the GPU nodes (hold %d -> 0): %s" % (held, why) if wanted == 0
                    else "holding %d GPU node(s) (a gpucluster job runs)" % wanted)
            sys.stdout.write("gpucluster idle stop: %s\n" % line)
            sys.stdout.flush()
    return last


def main():
    ns = os.environ["GPUCLUSTER_NAMESPACE"]
    hold = os.environ.get("GPUCLUSTER_HOLD_JOB") or "gpucluster-hold"
    minutes = float(os.environ["GPUCLUSTER_IDLE_MINUTES"])
    deadline = float(os.environ.get("GPUCLUSTER_DEADLINE") or 0)
    most = int(os.environ.get("GPUCLUSTER_NODES") or 1)
    scale = float(os.environ.get("GPUCLUSTER_IDLE_SCALE") or 60)
    poll = float(os.environ.get("GPUCLUSTER_POLL") or 30)
    api = Api()
    last = None
    while True:
        try:
            last = look(api, ns, hold, minutes, scale, deadline, most, last)
        except (OSError, ValueError, KeyError) as exc:  # URLError/HTTPError are OSErrors: try again next look
            sys.stdout.write("gpucluster idle stop: API call failed (%s); trying again\n" % exc)
            sys.stdout.flush()
        time.sleep(poll)


if __name__ == "__main__":
    main()
