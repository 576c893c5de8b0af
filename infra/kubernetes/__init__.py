"""Kubernetes, for any backend whose jobs run as pods (today gcp, on GKE): not a backend itself.

launcher (`KubernetesLauncher`: the run, outputs, `gpucluster ssh`, leftovers of a run), platform (what
the cluster's provider adds, injected: API access, node selector, pod requests, object-storage
identity), api (`KubeApi`, retries), plan (what each pod runs, the ConfigMap's files), manifests
(the objects built from a plan), objects (creating and deleting them), pods (watching the pods,
their logs), stage (`--data`/`--resume` through exec), check (the health check in every pod),
outputs (copying outputs out through exec), connect (exec and port-forward for `gpucluster ssh`),
gone (what of a run is left). The pod_*.py files are the programs the pods run, shipped by content
in the run's ConfigMap.

Nothing here imports a cloud's package (`gpucluster.infra.gcp`, `.aws`, `google.*`, `boto3`:
tests/test_layout.py); the `kubernetes` client is imported lazily.
"""
