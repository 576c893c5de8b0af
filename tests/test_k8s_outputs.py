"""Outputs out of the pods (gcp): the Kubernetes launcher's collect_outputs against FakeKubeApi, an
in-memory FAKE of the API server whose exec really runs the copy command over a folder per pod and
refuses exec into a container that is not running (tests/k8s_fake.py says where each behaviour
comes from). The entry script's handshake itself is run for real in test_entry_script_*."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time

import pytest

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("kubernetes")

from k8s_fake import FakeApiException, FakeKubeApi, PodScript, _Pod  # noqa: E402
from k8s_fake_http import serve  # noqa: E402
from test_k8s_launcher import NAME, assert_everything_deleted, cluster, healthy, job  # noqa: E402

from gpucluster.infra.kubernetes import launcher as k8s, plan as k8s_plan  # noqa: E402
from gpucluster.events import NullEvents  # noqa: E402
from gpucluster.watch.outputs import COMPLETE, FAILED, PARTIAL  # noqa: E402

BLOB = bytes(range(256)) * 300 + b"\xff\xfe\x00 not utf-8"  # binary: a text exec would mangle it


class Events(NullEvents):
    def __init__(self):
        self.lines, self.metrics, self.phases = [], [], []

    def on_line(self, rank, line):
        self.lines.append((rank, line))

    def on_metric(self, rank, record):
        self.metrics.append((rank, record))

    def on_phase(self, phase):
        self.phases.append(phase)


def with_outputs(script: PodScript, rank: int) -> PodScript:
    script.outputs = {"model.pt": BLOB + bytes([rank]), f"logs/rank{rank}.txt": f"rank {rank}\n"}
    return script


def sha(data) -> str:
    return hashlib.sha256(data if isinstance(data, bytes) else data.encode()).hexdigest()


def run(fake, tmp_path, nodes=2, http=False):
    """The launch and the copy. `http`: through the real kubernetes client and its websocket exec, the fake
    served over HTTP (tests/k8s_fake_http.py): every exec of the copy pool patches an ApiClient while it
    opens (kubernetes-client/python#928); no REST call may go out on a patched one."""
    api, stop = serve(fake) if http else (k8s.KubeApi(fake, fake, fake, stream=fake.stream), lambda: None)
    launcher = k8s.KubernetesLauncher(api=api, poll_interval=0, api_retry_s=10)
    spec = job(output_dir=str(tmp_path / "out"))
    result = err = None
    try:
        try:
            result = launcher.launch(cluster(nodes), spec, Events(), tmp_path / "logs")
        except KeyboardInterrupt as exc:
            err = exc
        assert fake.of("delete") == []  # nothing is deleted before the copy
        got = launcher.collect_outputs(spec, Events())
    finally:
        stop()
    assert fake.rest_upgrades == [] and launcher.cleanup_errors == []
    return result, err, {o.node_rank: o for o in got}


def slow_copy(fake, pod_name: str, seconds: float) -> None:
    """The copy out of `pod_name` takes `seconds` longer (its output folder is bigger)."""
    exec_in = fake.exec_in

    def slow(name, command, *args, **kw):
        if name == pod_name and k8s_plan.OUTPUT_DIR in " ".join(command or ()):
            time.sleep(seconds)
        return exec_in(name, command, *args, **kw)

    fake.exec_in = slow


def assert_copied(tmp_path, fake, rank):
    folder = tmp_path / "out" / f"node-{rank}"
    for rel, content in fake.scripts[rank].outputs.items():
        assert sha((folder / rel).read_bytes()) == sha(content), rel


def test_outputs_come_back_after_success_then_everything_is_deleted(tmp_path):
    fake = FakeKubeApi({r: with_outputs(healthy(r), r) for r in range(2)})
    result, _, got = run(fake, tmp_path, http=True)
    assert result.ok, result.failure
    for rank in range(2):
        assert got[rank].verdict == COMPLETE, got[rank].detail
        assert got[rank].files == 2 and got[rank].bytes == len(BLOB) + 1 + len(f"rank {rank}\n")
        assert_copied(tmp_path, fake, rank)
    execs = [c[4] for c in fake.of("exec")]
    assert any(k8s_plan.OUTPUT_DIR in c for c in execs) and any(k8s_plan.COLLECTED_FILE in c for c in execs)
    assert not any(k8s_plan.STOP_FILE in c for c in execs)  # every torchrun ended by itself
    assert_everything_deleted(fake)


def test_rest_calls_made_while_the_copy_execs_stay_rest_calls(tmp_path):
    """The copy opens its execs 8 at a time in threads while the launcher goes on making REST calls on
    its own client (its watch loop's listings, its deletes). `kubernetes.stream.stream` swaps the
    `request` of the ApiClient it is given for a websocket call until the handshake is done
    (kubernetes/stream/stream.py `_websocket_request`), so a REST call on that client meanwhile goes
    out as a websocket handshake and fails ("Handshake status 200 OK": kubernetes-client/python#928;
    harbor-framework/harbor PR #1517 on GKE), and two overlapping swaps leave it patched for good.
    Here the fake is served over HTTP (tests/k8s_fake_http.py: the real client and its real
    websocket exec; each exec's upgrade takes 0.2 s, as an API server relaying to the kubelet takes
    time; a REST path asked for with `Upgrade: websocket` is recorded in `rest_upgrades`), and another
    thread lists pods on the launcher's client all through `collect_outputs` of 4 pods.
    Checked once by hand (2026-11-26): with `k8s_outputs._exec` opening its streams on `api.core`
    (the shared client) instead of `api.exec_core()`, this test fails: 59 of the other thread's
    listings failed (the client's AttributeError on the refused handshake), each recorded by the
    fake as a websocket upgrade of GET /api/v1/namespaces/default/pods."""
    import threading

    nodes = 4
    fake = FakeKubeApi({r: with_outputs(healthy(r, nodes), r) for r in range(nodes)})
    api, stop = serve(fake)
    launcher = k8s.KubernetesLauncher(api=api, poll_interval=0, api_retry_s=10)
    spec = job(output_dir=str(tmp_path / "out"))
    done, listed, refused = threading.Event(), [0], []

    def lister():
        while not done.is_set():
            try:
                api.core.list_namespaced_pod("default", label_selector=f"gpucluster-job={NAME}")
                listed[0] += 1
            except Exception as exc:  # noqa: BLE001 - what the test is about
                refused.append(exc)
            time.sleep(0.005)

    try:
        result = launcher.launch(cluster(nodes), spec, Events(), tmp_path / "logs")
        assert result.ok, result.failure
        before = len(fake.of("exec"))
        thread = threading.Thread(target=lister, daemon=True)
        thread.start()
        try:
            got = {o.node_rank: o for o in launcher.collect_outputs(spec, Events())}
        finally:
            done.set()
            thread.join(10)
        copy_execs = len(fake.of("exec")) - before
    finally:
        stop()
    assert refused == [] and fake.rest_upgrades == [], (refused[:2], fake.rest_upgrades[:2])
    assert copy_execs >= 2 * nodes and listed[0] >= 10, (copy_execs, listed[0])  # they did overlap
    assert launcher.cleanup_errors == []  # the deletes after the copy were REST calls too
    assert all(got[r].verdict == COMPLETE for r in range(nodes)), [o.problem() for o in got.values()]
    for rank in range(nodes):
        assert_copied(tmp_path, fake, rank)
    assert_everything_deleted(fake)


def test_a_failed_rank_stops_the_others_and_every_output_still_comes_back(tmp_path):
    scripts = {0: with_outputs(PodScript(lines=["training"], exit_code=None), 0),  # would run forever
               1: with_outputs(PodScript(lines=["Traceback", "RuntimeError: CUDA out of memory"], exit_code=3), 1)}
    fake = FakeKubeApi(scripts)
    # node 0's copy takes longer than node 1's (a bigger output folder): node 1 is done first. The
    # Job controller acts on its pod as soon as it ends (tests/k8s_fake_jobs.py); on a Job that gives
    # up after one failed pod (backoffLimit 0) it would terminate pod 0 in the middle of its copy.
    slow_copy(fake, f"{NAME}-0-fake0", 0.6)
    result, _, got = run(fake, tmp_path, http=True)
    assert not result.ok and result.failed_node == 1 and "code 3" in result.failure
    assert [c[3] for c in fake.of("exec") if k8s_plan.STOP_FILE in c[4]] == [f"{NAME}-0-fake0"]
    assert got[0].verdict == got[1].verdict == COMPLETE
    assert_copied(tmp_path, fake, 0), assert_copied(tmp_path, fake, 1)
    assert_everything_deleted(fake)


def test_the_other_pods_are_told_to_stop_at_once_not_one_after_another(tmp_path):
    """A failure stops torchrun in every other pod with one exec each. An exec takes time on a real
    cluster: the API server relays it to the node's kubelet, which starts the command in the
    container (Kubernetes docs, "Communication between Nodes and the Control Plane": the API server
    to kubelet connections serve `kubectl exec`); 0.3 s each here. One after the other, 64 pods took
    14.6 s to be stopped (benchmarks/scale_k8s.py); they are sent k8s_outputs.EXEC_WORKERS at a time."""
    import threading

    nodes = 6
    scripts = {r: with_outputs(PodScript(lines=["training"], exit_code=None), r) for r in range(nodes - 1)}
    scripts[nodes - 1] = with_outputs(PodScript(lines=["Traceback", "RuntimeError: boom"], exit_code=3), nodes - 1)
    fake = FakeKubeApi(scripts)
    lock, inflight, peak = threading.Lock(), [0], [0]
    exec_in = fake.connect_get_namespaced_pod_exec

    def slow_exec(name, namespace, command=None, **kw):
        if k8s_plan.STOP_FILE not in (command or ()):
            return exec_in(name, namespace, command=command, **kw)
        with lock:
            inflight[0] += 1
            peak[0] = max(peak[0], inflight[0])
        try:
            time.sleep(0.3)
            return exec_in(name, namespace, command=command, **kw)
        finally:
            with lock:
                inflight[0] -= 1

    fake.connect_get_namespaced_pod_exec = slow_exec
    result, _, got = run(fake, tmp_path, nodes=nodes)
    assert not result.ok and result.failed_node == nodes - 1 and "code 3" in result.failure
    assert sorted(c[3] for c in fake.of("exec") if k8s_plan.STOP_FILE in c[4]) == \
        [f"{NAME}-{r}-fake{r}" for r in range(nodes - 1)]
    assert peak[0] >= 2, "the stops went out one after another"
    assert all(o.verdict == COMPLETE for o in got.values()), [o.problem() for o in got.values()]
    assert_everything_deleted(fake)


def test_ctrl_c_stops_torchrun_keeps_the_pods_for_the_copy_then_deletes(tmp_path):
    scripts = {r: with_outputs(PodScript(lines=["training"], exit_code=None), r) for r in range(2)}
    fake = FakeKubeApi(scripts)
    # a Ctrl-C once every pod trains (its files written, its first line out), at a pod listing
    fake.interrupt_when = lambda f: len(f.pods) == 2 and all("training" in p.log_text() for p in f.pods.values())
    result, err, got = run(fake, tmp_path)
    assert isinstance(err, KeyboardInterrupt) and result is None
    assert {c[3] for c in fake.of("exec") if k8s_plan.STOP_FILE in c[4]} == {f"{NAME}-0-fake0", f"{NAME}-1-fake1"}
    assert got[0].verdict == got[1].verdict == COMPLETE
    assert_copied(tmp_path, fake, 1)
    assert_everything_deleted(fake)


def test_a_pod_lost_before_the_copy_fails_that_node_only(tmp_path):
    fake = FakeKubeApi({r: with_outputs(healthy(r), r) for r in range(2)})
    launcher = k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake, stream=fake.stream), poll_interval=0)
    spec = job(output_dir=str(tmp_path / "out"))
    assert launcher.launch(cluster(2), spec, Events(), tmp_path / "logs").ok
    fake.lose(1)  # preempted between the end of the job and the copy
    time.sleep(0.3)  # the Job controller sees it before the copy starts (it reacts within ms)
    got = {o.node_rank: o for o in launcher.collect_outputs(spec, Events())}
    assert got[0].verdict == COMPLETE
    assert got[1].verdict == FAILED and f"pod {NAME}-1-fake1 is gone" in got[1].problem()
    assert not (tmp_path / "out" / "node-1" / "model.pt").exists()
    assert_everything_deleted(fake)


def test_unsafe_tar_members_are_refused_and_named(tmp_path):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as t:
        for name in ("ok.txt", "../escape.txt", "/etc/abs.txt"):
            info = tarfile.TarInfo(name)
            info.size = 2
            t.addfile(info, io.BytesIO(b"hi"))
    scripts = {0: healthy(0), 1: healthy(1)}
    scripts[1].raw_tar = buf.getvalue()
    fake = FakeKubeApi(scripts)
    _, _, got = run(fake, tmp_path, http=True)
    assert got[1].verdict == PARTIAL and got[1].files == 1
    assert "../escape.txt" in got[1].detail and "/etc/abs.txt" in got[1].detail
    assert (tmp_path / "out" / "node-1" / "ok.txt").read_bytes() == b"hi"
    assert not (tmp_path / "out" / "escape.txt").exists()
    assert got[0].verdict == COMPLETE and got[0].files == 0  # an empty folder comes back empty, complete


def test_without_an_output_folder_nothing_waits_and_launch_deletes(tmp_path):
    fake = FakeKubeApi({r: healthy(r) for r in range(2)})
    launcher = k8s.KubernetesLauncher(api=k8s.KubeApi(fake, fake, fake, stream=fake.stream), poll_interval=0)
    assert launcher.launch(cluster(2), job(), Events(), tmp_path / "logs").ok
    assert fake.of("exec") == [] and launcher.collect_outputs(job(), Events()) == []
    assert_everything_deleted(fake)


def test_the_fake_refuses_exec_into_an_ended_or_missing_pod(tmp_path):
    from k8s_fake_pod import _Container

    fake = FakeKubeApi({})
    pod = _Pod("p-0", 0, {}, PodScript())
    pod.apps = [("pytorch", [], {})]
    done = _Container("pytorch", [], {}, tmp_path)
    done.code = 0  # its command ended: the pod Succeeded
    pod.containers = [done]
    fake.pods["p-0"] = pod
    for name, why in (("p-0", "cannot exec into a container in a completed pod"), ("nope", "not found")):
        with pytest.raises(FakeApiException, match=why) as info:
            fake.stream(fake.connect_get_namespaced_pod_exec, name, "default", command=["true"],
                        container="pytorch", stdin=False, stdout=True, stderr=True, tty=False,
                        binary=True, _preload_content=False)
        assert info.value.status == 0  # as ws_client.websocket_call raises it


def entry(tmp_path, argv, **env_extra):
    (tmp_path / "argv.json").write_text(json.dumps([argv]))
    (tmp_path / "entry.py").write_text(k8s_plan.ENTRYPOINT)
    control = tmp_path / "control"
    env = {**os.environ, "JOB_COMPLETION_INDEX": "0", "GPUCLUSTER_CONTROL_DIR": str(control),
           "GPUCLUSTER_OUTPUT_DIR": str(tmp_path / "outputs"), **env_extra}
    proc = subprocess.Popen([sys.executable, str(tmp_path / "entry.py")], env=env, stdout=subprocess.PIPE, text=True)
    return proc, control


def keeper(tmp_path, control, collecting, wait_s="60"):
    (tmp_path / "keeper.py").write_text(k8s_plan.KEEPER_PROGRAM)
    env = {**os.environ, "GPUCLUSTER_CONTROL_DIR": str(control), "GPUCLUSTER_COLLECTING": "1" if collecting else "0",
           "GPUCLUSTER_COLLECT_WAIT_S": wait_s}
    return subprocess.Popen([sys.executable, str(tmp_path / "keeper.py")], env=env)


def test_entry_script_ends_with_torchruns_code_and_the_keeper_waits_for_the_copy(tmp_path):
    """The real programs: torchrun (here a python that exits 7 after writing a file) ends; the entry
    script's job_end record says 7, it writes 7 to `exit_code` and exits 7 (the training container's
    status carries the code); the keeper keeps the pod running until `collected` exists."""
    proc, control = entry(tmp_path, [sys.executable, "-c",
                                     "import os; open(os.environ['GPUCLUSTER_OUTPUT_DIR'] + '/x', 'w').write('1'); "
                                     "raise SystemExit(7)"])
    keep = keeper(tmp_path, control, collecting=True)
    try:
        line = proc.stdout.readline()
        assert json.loads(line.split(" ", 1)[1]) == {"kind": "job_end", "exit_code": 7, "stopped": False}
        assert proc.wait(timeout=10) == 7 and (control / "exit_code").read_text() == "7\n"
        assert (tmp_path / "outputs" / "x").read_text() == "1"
        with pytest.raises(subprocess.TimeoutExpired):
            keep.wait(timeout=1.5)  # still running: the copy has not been made
        (control / "collected").touch()
        assert keep.wait(timeout=10) == 0
    finally:
        for p in (proc, keep):
            if p.poll() is None:
                p.kill()


def test_keeper_without_collection_ends_with_the_job_and_its_wait_is_bounded(tmp_path):
    control = tmp_path / "control"
    control.mkdir()
    quick = keeper(tmp_path, control, collecting=False)
    other = tmp_path / "b"
    other.mkdir()
    bounded = keeper(other, other / "control", collecting=True, wait_s="1")
    try:
        time.sleep(1.0)
        assert quick.poll() is None and bounded.poll() is None  # torchrun has not ended yet
        (control / "exit_code").write_text("0\n")
        (other / "control" / "exit_code").write_text("0\n")
        assert quick.wait(timeout=10) == 0  # nothing to copy: the pod may complete
        assert bounded.wait(timeout=10) == 0  # nobody came to copy within the wait
    finally:
        for p in (quick, bounded):
            if p.poll() is None:
                p.kill()


def test_entry_script_stop_file_stops_torchrun(tmp_path):
    proc, control = entry(tmp_path, [sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        end = time.monotonic() + 10
        while not control.is_dir() and time.monotonic() < end:
            time.sleep(0.05)
        (control / "stop").touch()
        record = json.loads(proc.stdout.readline().split(" ", 1)[1])
        assert record == {"kind": "job_end", "exit_code": 143, "stopped": True}  # SIGTERM: 128 + 15
        assert proc.wait(timeout=10) == 143
    finally:
        if proc.poll() is None:
            proc.kill()


def test_entry_script_lays_the_shipped_folder_down_and_runs_from_it(tmp_path):
    """With a shipped script: the read-only ConfigMap copy (user/, beside entry.py) is copied into the
    working folder, the mark is made after it, and the command runs there (relative paths work)."""
    user = tmp_path / "user" / "sub"
    user.mkdir(parents=True)
    (user / "train.py").write_text("open('out.txt', 'w').write(open('sub/notes.txt').read())")
    (user / "notes.txt").write_text("shipped\n")
    code, mark = tmp_path / "run" / "code", tmp_path / "run" / "shipped"
    proc, _ = entry(tmp_path, [sys.executable, str(code / "sub" / "train.py")], GPUCLUSTER_CODE_DIR=str(code),
                    GPUCLUSTER_SHIPPED_MARK=str(mark))
    assert proc.wait(timeout=10) == 0
    assert (code / "out.txt").read_text() == "shipped\n"  # written beside the copy, read relative to it
    assert (code / "sub" / "notes.txt").stat().st_mtime_ns <= mark.stat().st_mtime_ns < \
        (code / "out.txt").stat().st_mtime_ns
