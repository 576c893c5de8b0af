"""`gpucluster ssh` on a kept gcp cluster (infra/kubernetes/connect.py), every command its own CLI process
(tests/kept_gcp_cli.py: the stack's outputs from a file, their kubeconfig pointing at the FAKE
Kubernetes API server, tests/k8s_fake_http.py, which the REAL kubernetes client talks to over HTTP and
websockets). The kept cluster is in a real ledger; the job running on it is an Indexed Job of two pods
labelled as the launcher labels them, whose containers are real processes here: node N's training
container serves HTTP on BASE+N (a folder with a 300 KB file), the keeper container sleeps.

Covered: a command's stdout, stderr and exit code, and its stream dropped by an API outage (one line);
refusals (no job running, a bad NODE, a NODE past the cluster's nodes, a -L host the portforward API
cannot reach, a bad or taken or repeated local port, a shell without a terminal), each one line and
exit 2 with nothing opened on the cluster; -L relaying real bytes both ways to the pod's server, two
connections at once, each over a websocket of its own, closed by Ctrl-C (SIGINT) with exit 0 and the
port free again; a port nothing listens on in the pod; a shell in a real pseudo-terminal (tmux) that
runs `echo`, sees the terminal's size (and its change), passes Ctrl-C to the pod, and exits with the
shell's code.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

sys.path.insert(0, str(Path(__file__).parent))

pytest.importorskip("kubernetes")

from k8s_fake import FakeKubeApi  # noqa: E402
from k8s_fake_http import serve  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RUN = "r20261126-120000-abcdef"


def _free_pair() -> int:
    """A port P with P and P+1 free (node N's server listens on P+N)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 65000:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two free ports")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class KeptGke:
    """A kept gcp cluster `demo` of 2 nodes: its ledger rows, its stack outputs, the fake API server."""

    def __init__(self, tmp_path: Path, home: Path):
        from gpucluster.ledger.store import Ledger

        self.fake = FakeKubeApi({}, skew=0, delete_ticks=0)
        self.fake.streaming_exec = True  # a command's output as it comes (kubectl exec streams it)
        self.api, self.stop = serve(self.fake)
        server = self.api.core.api_client.configuration.host
        kubeconfig = {"apiVersion": "v1", "kind": "Config", "current-context": "demo",
                      "clusters": [{"name": "demo", "cluster": {"server": server}}],
                      "users": [{"name": "demo", "user": {"exec": {"command": "gke-gcloud-auth-plugin"}}}],
                      "contexts": [{"name": "demo", "context": {"cluster": "demo", "user": "demo"}}]}
        self.outputs = tmp_path / "outputs.json"
        self.outputs.write_text(json.dumps({"demo": {
            "cluster_name": "demo", "nodes": 2, "zone": "us-central1-a", "machine_type": "n1-standard-8",
            "gpus_per_node": 1, "accelerator_type": "nvidia-tesla-v100", "kubeconfig": yaml_dump(kubeconfig)}}))
        self.home = home
        led = Ledger.open_default()
        now = time.time()
        rid = "r20261126-110000-aaaaaa"
        led.create_run(rid, cloud="gcp", cluster="demo", nodes=2, gpus_per_node=1, command=["gpucluster", "up"],
                       spec={"cloud": "gcp", "nodes": 2, "name": "demo", "max_lifetime_minutes": 240,
                             "options": {"namespace": "default"}}, now=now - 600)
        led.resource_requested(rid, "gke-cluster", "demo", now=now - 600)
        led.finish_run(rid, status="succeeded", exit_code=0, teardown="kept", now=now - 300)
        self.www = tmp_path / "www"
        self.www.mkdir()
        self.blob = os.urandom(300_000)
        (self.www / "blob.bin").write_bytes(self.blob)
        self.base = _free_pair()

    def start_job(self) -> None:
        """The job running on the cluster: its pods as the launcher labels them, both Running."""
        from kubernetes import client as k

        labels = {"app.kubernetes.io/managed-by": "gpucluster", "gpucluster-run": RUN,
                  "gpucluster-job": f"gpucluster-{RUN}"}
        serve_cmd = ["sh", "-c", f"exec python -m http.server --bind 127.0.0.1 --directory {self.www} "
                                 f"$(({self.base} + JOB_COMPLETION_INDEX))"]
        keeper = ["sh", "-c", "exec sleep 600"]
        job = k.V1Job(metadata=k.V1ObjectMeta(name=f"gpucluster-{RUN}", namespace="default", labels=labels),
                      spec=k.V1JobSpec(completions=2, parallelism=2, completion_mode="Indexed", backoff_limit=0,
                                       template=k.V1PodTemplateSpec(
                                           metadata=k.V1ObjectMeta(labels=labels),
                                           spec=k.V1PodSpec(restart_policy="Never", containers=[
                                               k.V1Container(name="pytorch", image="img", command=serve_cmd),
                                               k.V1Container(name="gpucluster", image="img", command=keeper)]))))
        self.api.batch.create_namespaced_job("default", job)  # through the API server, as the launcher does
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            pods = self.api.core.list_namespaced_pod("default").items  # each listing is a kubelet tick
            if len(pods) == 2 and all(p.status.phase == "Running" for p in pods) and all(
                    _listening(self.base + n) for n in range(2)):
                return
            time.sleep(0.1)
        raise AssertionError("the job's pods did not come up")

    def env(self, **extra: str) -> dict[str, str]:
        return {**os.environ, "GPUCLUSTER_HOME": str(self.home), "FAKE_GCP_OUTPUTS": str(self.outputs),
                "COLUMNS": "200", **extra}

    def argv(self, *args: str) -> list[str]:
        return [sys.executable, str(HERE / "kept_gcp_cli.py"), *args]

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(self.argv(*args), env=self.env(), cwd=ROOT, capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=timeout)

    def streams(self) -> list[tuple]:
        return [c for c in self.fake.calls if c[0] in ("exec", "portforward")]

    def close(self) -> None:
        for pod in list(self.fake.pods.values()):
            pod.kill()
        self.stop()


def yaml_dump(obj) -> str:
    import yaml

    return yaml.safe_dump(obj)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@pytest.fixture
def gke(tmp_path, home):
    c = KeptGke(tmp_path, home)
    yield c
    c.close()


def _one_line_error(r: subprocess.CompletedProcess, needle: str) -> None:
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert lines and lines[0].startswith("gpucluster: error: ") and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr and len([ln for ln in lines if not ln.startswith("hint:")]) == 1, r.stderr


def test_refusals_are_one_line_exit_2_and_open_nothing(gke):
    r = gke.cli("ssh", "demo", "--", "true")
    _one_line_error(r, "no job is running on it")
    assert "gpucluster exec demo" in r.stderr
    gke.start_job()
    for args, needle in [
            (("demo", "2", "--", "true"), "node 2 is not allowed: 0 to 1 (cluster demo has 2 node(s))"),
            (("demo", "-1"), "No such option '-1'"),
            (("demo", "-L", "6006:example.com:6006"), "HOST must be localhost"),
            (("demo", "-L", "70000:localhost:80"), "ports 1-65535"),
            (("demo",), "a shell needs a terminal on stdin")]:
        _one_line_error(gke.cli("ssh", *args), needle)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    try:
        port = taken.getsockname()[1]
        _one_line_error(gke.cli("ssh", "demo", "-L", f"{port}:localhost:{gke.base}"),
                        f"127.0.0.1:{port} cannot be used on this machine")
    finally:
        taken.close()
    free = _free_port()
    _one_line_error(gke.cli("ssh", "demo", "-L", f"{free}:localhost:1", "-L", f"{free}:localhost:2"),
                    f"-L: local port {free} is given twice")
    assert not _listening(free)
    assert gke.streams() == []  # nothing was opened on the cluster


def test_a_command_gives_its_output_and_exit_code(gke):
    gke.start_job()
    r = gke.cli("ssh", "demo", "1", "--", "sh", "-c", "echo out-$((6*7)); echo err-line >&2; exit 7")
    assert r.returncode == 7, r.stdout + r.stderr
    assert r.stdout == "out-42\n" and r.stderr == "err-line\n"
    execs = [c for c in gke.fake.calls if c[0] == "exec"]
    assert len(execs) == 1 and execs[0][3] == f"gpucluster-{RUN}-1-fake1"  # node 1's pod
    # output larger than a websocket frame, in order, and exit 0
    r = gke.cli("ssh", "demo", "--", "python", "-c", "import sys; sys.stdout.write('ab' * 100000)")
    assert r.returncode == 0 and r.stdout == "ab" * 100000, r.stderr[-2000:]
    assert [c for c in gke.fake.calls if c[0] == "exec"][-1][3] == f"gpucluster-{RUN}-0-fake0"


def test_a_command_whose_connection_drops_ends_with_one_line(gke):
    """The control plane goes away mid-command (an upgrade): the stream ends with no status."""
    gke.start_job()
    proc = subprocess.Popen(gke.argv("ssh", "demo", "--", "sh", "-c", "echo started; sleep 30"), env=gke.env(),
                            cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline() == "started\n"
        gke.fake.outage(2)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode not in (0, 2) and "Traceback" not in err, (proc.returncode, out, err, gke.fake.calls[-5:])
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines[0].startswith("gpucluster: error: the connection to pod gpucluster-") and "was lost" in lines[0], err


def _get(port: int, path: str, results: dict, key: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(f"GET {path} HTTP/1.0\r\nHost: pod\r\n\r\n".encode())
        data = b""
        while True:
            more = s.recv(65536)
            if not more:
                break
            data += more
    results[key] = data


def test_a_tunnel_relays_two_connections_at_once_and_ctrl_c_closes_it(gke):
    import threading

    gke.start_job()
    local = _free_port()
    remote = gke.base + 1  # node 1's server
    tunnel = subprocess.Popen(gke.argv("ssh", "demo", "1", "-L", f"{local}:localhost:{remote}"), env=gke.env(),
                              cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _listening(local):
            assert tunnel.poll() is None and time.monotonic() < deadline, tunnel.communicate()
            time.sleep(0.1)
        before = len([c for c in gke.fake.calls if c[0] == "portforward"])
        # two connections at once: both requests sent before either answer is read
        a = socket.create_connection(("127.0.0.1", local), timeout=30)
        b = socket.create_connection(("127.0.0.1", local), timeout=30)
        a.sendall(b"GET /blob.bin HTTP/1.0\r\nHost: pod\r\n\r\n")
        b.sendall(b"GET /missing HTTP/1.0\r\nHost: pod\r\n\r\n")
        got = {}
        for key, s in (("b", b), ("a", a)):
            data = b""
            while more := s.recv(65536):
                data += more
            got[key] = data  # the pod's server closed: the relay ended this side too
            s.close()
        head, _, body = got["a"].partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.0 200") and hashlib.sha256(body).digest() == hashlib.sha256(gke.blob).digest()
        assert got["b"].startswith(b"HTTP/1.0 404")
        results: dict = {}
        threads = [threading.Thread(target=_get, args=(local, "/blob.bin", results, str(i))) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert all(results[str(i)].endswith(gke.blob) for i in range(3))
        forwards = [c for c in gke.fake.calls if c[0] == "portforward"][before:]
        # one websocket per connection (5, and the readiness probe's that may land after `before`)
        assert len(forwards) in (5, 6) and set(forwards) == {("portforward", "pod", f"gpucluster-{RUN}-1-fake1", remote)}
    finally:
        os.killpg(tunnel.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the foreground group
        out, err = tunnel.communicate(timeout=30)
    assert tunnel.returncode == 0, err
    assert f"forwarding 127.0.0.1:{local} -> localhost:{remote} on node 1 of demo; Ctrl-C closes it" in err
    assert "Traceback" not in err and "error" not in err.lower(), err
    assert not _listening(local)  # the listener is gone
    assert _listening(remote)  # the pod's server is untouched
    assert gke.fake.rest_upgrades == []  # no REST call went out on a client a stream had patched


def test_a_tunnel_to_a_port_nothing_listens_on_says_so(gke):
    gke.start_job()
    local, dead = _free_port(), _free_port()
    tunnel = subprocess.Popen(gke.argv("ssh", "demo", "-L", f"{local}:localhost:{dead}"), env=gke.env(), cwd=ROOT,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not _listening(local):
            assert tunnel.poll() is None and time.monotonic() < deadline, tunnel.communicate()
            time.sleep(0.1)
        with socket.create_connection(("127.0.0.1", local), timeout=30) as s:
            s.sendall(b"hello")
            assert s.recv(100) == b""  # closed: nothing to connect to in the pod
        time.sleep(1)
    finally:
        os.killpg(tunnel.pid, signal.SIGINT)
        out, err = tunnel.communicate(timeout=30)
    assert tunnel.returncode == 0 and "Traceback" not in err, err
    assert f"error forwarding port {dead} to pod gpucluster-{RUN}-0-fake0" in err and "connection refused" in err


def test_a_shell_in_a_real_terminal(gke):
    from terminal import Terminal, need_tmux

    need_tmux()
    gke.start_job()
    env = {"GPUCLUSTER_HOME": str(gke.home), "FAKE_GCP_OUTPUTS": str(gke.outputs), "PS1": "pod$ "}
    term = Terminal(gke.argv("ssh", "demo", "1"), env=env, cwd=str(ROOT), width=80, height=40)
    try:
        term.wait_for(r"[#$] ?$", timeout=60)  # the pod's shell prompts
        term.send("PS1='pod$ '", "Enter")
        term.send("echo hi-$((6*7)) on-$JOB_COMPLETION_INDEX; stty size", "Enter")
        term.wait_for(r"^hi-42 on-1$", timeout=60)
        term.wait_for(r"^40 80$", timeout=30)  # the terminal's size reached the pod's terminal
        subprocess.run(term._tmux("resize-window", "-t", term.name, "-x", "100", "-y", "30"), check=True)
        time.sleep(0.5)
        term.send("stty size", "Enter")
        term.wait_for(r"^30 100$", timeout=30)  # and its change (SIGWINCH)
        term.send("sleep 30", "Enter")
        time.sleep(1)
        term.send("C-c")  # raw mode: Ctrl-C goes to the pod's terminal, not to gpucluster
        term.send("echo after-$?", "Enter")
        term.wait_for(r"^after-130$", timeout=30)
        term.send("exit 5", "Enter")
        assert term.exit_code(timeout=60) == 5  # the shell's exit code is gpucluster's
    finally:
        term.close()
    execs = [c for c in gke.fake.calls if c[0] == "exec"]
    assert len(execs) == 1 and execs[0][3] == f"gpucluster-{RUN}-1-fake1"
