"""The pods' GCS program (`infra/gcp/gcs_node.py`, run as `gcs.GcsTransfer().script(...)` by sh, as
the Kubernetes launcher runs it in a pod) against a Cloud Storage JSON API on loopback
(gcp-storage-emulator behind a layer that answers as GCS does where the emulator is kinder:
tests/gcs_emulator.py), and its token path against a metadata server stand-in."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))
from gcs_emulator import gcs_server, metadata_server  # noqa: E402,F401

from gpucluster.infra.gcp import gcs  # noqa: E402


def _node(srv, mode, a, b, *, python=sys.executable, path="/usr/bin:/bin", extra=None):
    """The script a pod runs, run here by sh with the emulator's endpoint."""
    script = gcs.GcsTransfer().script(python, mode, a, b)
    env = {**srv.env, "PATH": path, "HOME": os.environ.get("HOME", "/root"), **(extra or {})}
    return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env, timeout=120)


# IAM grants take up to 7 minutes to apply (GRANT_WAIT_S = 420 s); scaled down here
QUICK_GRANTS = {"GPUCLUSTER_GCS_GRANT_WAIT_S": "1", "GPUCLUSTER_GCS_RETRY_BASE_S": "0.05"}


def _answer(r) -> dict:
    return json.loads(r.stdout.splitlines()[-1])


def _tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob("*") if p.is_file()}


def _dataset(tmp_path: Path) -> Path:
    ds = tmp_path / "ds"
    (ds / "shards").mkdir(parents=True)
    for i in range(5):
        (ds / "shards" / f"part-{i}.bin").write_bytes(os.urandom(50_000 + i))
    (ds / "labels.txt").write_text("0 1\n")
    (ds / "empty.txt").write_bytes(b"")
    return ds


def test_pull_a_folder_through_pages_and_a_transient_error(gcs_server, tmp_path):
    gcs_server.make_bucket("data-bkt")
    want = gcs_server.put_tree("data-bkt", "train", _dataset(tmp_path))
    gcs_server.put("data-bkt", "trainer/other.bin", b"not under train/")  # a sibling prefix
    gcs_server.put("data-bkt", "train/", b"")  # console "folder" placeholders: skipped
    gcs_server.put("data-bkt", "train/folder/", b"")
    gcs_server.state.fail_next = 1  # GCS answers 503 now and then: retried
    dest = tmp_path / "pod" / "data"
    r = _node(gcs_server, "pull", "gs://data-bkt/train", str(dest))
    assert r.returncode == 0, r.stderr
    got = _answer(r)
    assert got == {"tool": "gcs-json-api", "files": 7, "bytes": sum(50_000 + i for i in range(5)) + 4}
    assert _tree(dest) == want  # every file, sha256 equal, nothing else (no .gpucluster-part left)
    lists = [q for m, p, q, _ in gcs_server.state.requests if m == "GET" and p.endswith("/o")]
    assert all(q["prefix"] == ["train/"] for q in lists)  # what the read condition admits
    assert sum("pageToken" in q for q in lists) >= 4  # 9 objects at 2 a page: the tokens were followed
    assert all(auth is None for *_, auth in gcs_server.state.requests)  # an emulator: no token sent


def test_pull_whole_bucket(gcs_server, tmp_path):
    gcs_server.make_bucket("whole-bkt")
    gcs_server.put("whole-bkt", "a.txt", b"a")
    gcs_server.put("whole-bkt", "d/b.txt", b"bb")
    r = _node(gcs_server, "pull", "gs://whole-bkt", str(tmp_path / "d"))
    assert r.returncode == 0, r.stderr
    assert _answer(r)["files"] == 2 and (tmp_path / "d" / "d" / "b.txt").read_bytes() == b"bb"


def test_pull_failures_name_the_cause(gcs_server, tmp_path):
    gcs_server.make_bucket("data-bkt")
    gcs_server.put("data-bkt", "trainer/x.bin", b"x")
    r = _node(gcs_server, "pull", "gs://data-bkt/train", str(tmp_path / "d"))
    assert r.returncode == 4 and "gs://data-bkt/train holds no objects" in r.stderr, r.stderr
    r = _node(gcs_server, "pull", "gs://no-such-bkt/x", str(tmp_path / "d"))
    assert r.returncode == 4 and "bucket no-such-bkt does not exist" in r.stderr, r.stderr
    gcs_server.state.deny.add("locked-bkt")
    r = _node(gcs_server, "pull", "gs://locked-bkt/x", str(tmp_path / "d"), extra=QUICK_GRANTS)
    assert r.returncode == 4 and "403 from GCS for bucket locked-bkt (gs://locked-bkt/x)" in r.stderr
    assert "still after 1 s" in r.stderr  # retried for the (scaled-down) propagation window first
    assert "Workload Identity" in r.stderr and "iam.gke.io/gcp-service-account" in r.stderr


def test_pull_refuses_names_that_would_land_outside_dest(gcs_server, tmp_path):
    gcs_server.make_bucket("data-bkt")
    gcs_server.put("data-bkt", "train/ok.bin", b"ok")
    gcs_server.state.extra_listed["data-bkt"] = [("train/../../escape.txt", 4)]  # GCS can hold this name
    dest = tmp_path / "pod" / "data"
    r = _node(gcs_server, "pull", "gs://data-bkt/train", str(dest))
    assert r.returncode == 4 and "refusing object name 'train/../../escape.txt'" in r.stderr, r.stderr
    assert not dest.exists() and not (tmp_path / "escape.txt").exists()  # checked before anything was written
    downloads = [p for m, p, q, _ in gcs_server.state.requests if q.get("alt") == ["media"]]
    assert downloads == []


def test_push_a_folder_under_the_prefix(gcs_server, tmp_path):
    gcs_server.make_bucket("out-bkt")
    out = _dataset(tmp_path)
    (out / "link.bin").symlink_to(out / "labels.txt")  # symlinks are not followed
    gcs_server.state.fail_next = 2
    r = _node(gcs_server, "push", str(out), "gs://out-bkt/runs/r1/node-0")
    assert r.returncode == 0, r.stderr
    sizes = {p.relative_to(out).as_posix(): p.stat().st_size for p in out.rglob("*") if p.is_file() and not p.is_symlink()}
    got = _answer(r)
    assert got == {"tool": "gcs-json-api", "files": 7, "bytes": sum(sizes.values()), "total_files": 7, "failed": []}
    assert gcs_server.objects("out-bkt") == {f"runs/r1/node-0/{rel}": n for rel, n in sizes.items()}
    for rel, digest in _tree(out).items():
        if rel != "link.bin":
            assert gcs_server.sha256("out-bkt", f"runs/r1/node-0/{rel}") == digest
    uploads = [q for m, p, q, _ in gcs_server.state.requests if m == "POST" and p.startswith("/upload/")]
    assert all(q["uploadType"] == ["media"] and q["ifGenerationMatch"] == ["0"] for q in uploads)


def test_push_failures_are_reported_per_file(gcs_server, tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "m.pt").write_bytes(b"x" * 10)
    r = _node(gcs_server, "push", str(tmp_path / "o"), "gs://no-such-bkt/runs")
    assert r.returncode == 4
    got = _answer(r)
    assert got["files"] == 0 and got["total_files"] == 1
    assert got["failed"][0].startswith("m.pt: ") and "bucket no-such-bkt does not exist" in got["failed"][0]
    # an object already there is never overwritten (ifGenerationMatch=0; objectCreator cannot anyway)
    gcs_server.make_bucket("out-bkt")
    gcs_server.put("out-bkt", "runs/m.pt", b"earlier")
    (tmp_path / "o" / "new.pt").write_bytes(b"y" * 3)
    r = _node(gcs_server, "push", str(tmp_path / "o"), "gs://out-bkt/runs")
    assert r.returncode == 3, r.stdout
    got = _answer(r)
    assert got["files"] == 1 and got["bytes"] == 3 and got["total_files"] == 2
    assert len(got["failed"]) == 1 and got["failed"][0].startswith("m.pt: the object already exists")
    assert gcs_server.objects("out-bkt") == {"runs/m.pt": 7, "runs/new.pt": 3}
    # nothing to push: done, nothing sent
    (tmp_path / "none").mkdir()
    r = _node(gcs_server, "push", str(tmp_path / "none"), "gs://out-bkt/runs2")
    assert r.returncode == 0 and _answer(r)["total_files"] == 0


def test_no_python_on_the_node_says_so(gcs_server, tmp_path):
    r = _node(gcs_server, "pull", "gs://b-x/y", str(tmp_path / "d"), python="/nonexistent/python", path="/nonexistent")
    assert r.returncode == 4 and "neither /nonexistent/python nor python3" in r.stderr


# -- the token path (Workload Identity): in-process, the storage calls going to the emulator -------
def test_token_from_the_metadata_server_is_sent_and_refreshed_on_401(gcs_server, metadata_server, tmp_path):
    from gpucluster.infra.gcp import gcs_node

    gcs_server.make_bucket("data-bkt")
    gcs_server.put("data-bkt", "train/a.bin", b"a" * 100)
    gcs_server.put("data-bkt", "train/b.bin", b"b" * 200)
    client = gcs_node.Gcs(gcs_server.url, gcs_node.Tokens(metadata_server.host))
    gcs_server.state.reject_tokens.add("tok-1")  # revoked: a 401 fetches a fresh token once
    before = len(gcs_server.state.requests)
    assert gcs_node.pull(client, "gs://data-bkt/train", str(tmp_path / "d")) == (2, 300)
    auths = [a for *_, a in gcs_server.state.requests[before:]]
    assert auths[0] == "Bearer tok-1" and set(auths[1:]) == {"Bearer tok-2"}
    assert metadata_server.issued == 2
    assert all(h.get("Metadata-Flavor") == "Google" for h in metadata_server.requests)
    # GCE_METADATA_HOST is the override a pod honours (as google-auth does)
    os.environ["GCE_METADATA_HOST"] = metadata_server.host
    try:
        assert gcs_node.Tokens().url == f"http://{metadata_server.host}/computeMetadata/v1/instance/service-accounts/default/token"
    finally:
        del os.environ["GCE_METADATA_HOST"]
    # a token the storage side keeps refusing: 401 once more, then the Workload Identity hint
    gcs_server.state.reject_tokens.add("tok-2")
    gcs_server.state.reject_tokens.add("tok-3")
    with pytest.raises(gcs_node.Failure, match="401 from GCS for bucket data-bkt.*Workload Identity"):
        gcs_node.pull(client, "gs://data-bkt/train", str(tmp_path / "e"))


def test_metadata_server_refusal_is_explained(metadata_server):
    from gpucluster.infra.gcp import gcs_node

    tokens = gcs_node.Tokens(metadata_server.host)
    tokens.url = tokens.url.replace("/default/", "/missing/")  # the real server answers 404 for an unknown account
    with pytest.raises(gcs_node.Failure, match="answered 404.*Workload Identity"):
        tokens.get()
    assert gcs_node.Tokens(metadata_server.host).get() == "tok-1"


def test_node_program_is_standard_library_only():
    source = (Path(gcs.__file__).parent / "gcs_node.py").read_text()
    code = ("import sys; sys.modules['google'] = None\n"
            "import builtins; real = builtins.__import__\n"
            "def guard(name, *a, **k):\n"
            "    assert name.split('.')[0] not in ('google', 'gpucluster', 'requests', 'urllib3'), name\n"
            "    return real(name, *a, **k)\n"
            "builtins.__import__ = guard\n"
            "exec(compile(sys.argv[1], 'gcs_node', 'exec'), {'__name__': 'gcs_node'})\n")
    r = subprocess.run([sys.executable, "-I", "-c", code, source], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_a_403_from_a_grant_still_propagating_is_retried_until_it_applies(gcs_server, tmp_path):
    """IAM docs, "Access change propagation": a new grant takes about 2 minutes, sometimes 7 or more.
    Here it applies 2 s after the first request; the pull waits (window scaled to 5 s) and succeeds."""
    gcs_server.make_bucket("new-bkt")
    want = gcs_server.put_tree("new-bkt", "train", _dataset(tmp_path))
    gcs_server.state.grant_after["new-bkt"] = 2.0
    r = _node(gcs_server, "pull", "gs://new-bkt/train", str(tmp_path / "d"),
              extra={"GPUCLUSTER_GCS_GRANT_WAIT_S": "5", "GPUCLUSTER_GCS_RETRY_BASE_S": "0.1"})
    assert r.returncode == 0, r.stderr
    assert _tree(tmp_path / "d") == want
    denied = [q for m, p, q, _ in gcs_server.state.requests if p.endswith("/o") and m == "GET"]
    assert len(denied) >= 2  # refused at first, then allowed


def test_a_grant_that_never_applies_names_bucket_prefix_and_principal(gcs_server, metadata_server, tmp_path,
                                                                       monkeypatch):
    gcs_server.state.deny.add("locked-bkt")
    monkeypatch.setenv("GPUCLUSTER_GCS_RETRY_BASE_S", "0.05")
    from gpucluster.infra.gcp import gcs_node

    client = gcs_node.Gcs(gcs_server.url, gcs_node.Tokens(metadata_server.host), gcs_node.Grants(1.0))
    client.grants = client.tokens.grants = gcs_node.Grants(1.0)
    with pytest.raises(gcs_node.Failure) as err:
        gcs_node.pull(client, "gs://locked-bkt/imagenet/train", str(tmp_path / "d"))
    msg = str(err.value)
    assert "403 from GCS for bucket locked-bkt (gs://locked-bkt/imagenet/train)" in msg
    assert "as gpuc-demo@my-proj.iam.gserviceaccount.com" in msg and "still after 1 s" in msg


def test_a_new_workload_identity_binding_is_waited_for_at_the_metadata_server(metadata_server, monkeypatch):
    """The GKE metadata server cannot mint the pod's token until the workloadIdentityUser grant applies."""
    from gpucluster.infra.gcp import gcs_node

    monkeypatch.setenv("GPUCLUSTER_GCS_RETRY_BASE_S", "0.05")
    metadata_server.deny_for_s = 1.0
    assert gcs_node.Tokens(metadata_server.host, gcs_node.Grants(5.0)).get() == "tok-1"
    metadata_server.first, metadata_server.deny_for_s = None, 60.0
    with pytest.raises(gcs_node.Failure, match="403.*getAccessToken"):
        gcs_node.Tokens(metadata_server.host, gcs_node.Grants(0.5)).get()
