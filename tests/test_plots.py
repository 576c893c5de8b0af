"""PNG plots and the Markdown report, from fixture ledger data."""

import struct
import zlib

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("matplotlib")

from gpucluster.sweep.diagnose import diagnose  # noqa: E402
from gpucluster.errors import UsageError  # noqa: E402
from gpucluster.costing.plots import plot_run, scaling_plots, utilisation_plot, write_report  # noqa: E402
from gpucluster.sweep.runner import compare_cpu_gpu  # noqa: E402
from test_diagnose import Fixture, seed_003, util  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path) -> tuple[int, int]:
    """(width, height) of a valid PNG: signature, then an IHDR chunk with a correct CRC."""
    data = open(path, "rb").read()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    length, ctype = struct.unpack(">I4s", data[8:16])
    assert ctype == b"IHDR" and length == 13
    body = data[16:16 + 13]
    (crc,) = struct.unpack(">I", data[29:33])
    assert crc == zlib.crc32(b"IHDR" + body)
    assert data.rstrip(b"\x00")[-8:-4] == b"IEND"
    width, height = struct.unpack(">II", body[:8])
    return width, height


def assert_sensible_png(path, min_w=400, min_h=250):
    w, h = png_size(path)
    assert min_w <= w <= 4000 and min_h <= h <= 4000, (path, w, h)
    assert path.stat().st_size > 5000  # a blank canvas compresses to far less


def test_png_check_rejects_garbage(tmp_path):
    bad = tmp_path / "x.png"
    bad.write_bytes(b"GIF89a" + b"\x00" * 100)
    with pytest.raises(AssertionError):
        png_size(bad)


def test_utilisation_plot_one_line_per_node(tmp_path):
    recs = []
    for i in range(10):
        for node in range(3):
            u = util(node, 40.0 + 5 * node + i, 30.0 + 10 * node)
            recs.append({"kind": "util", "time": 1000.0 + i, **u})
    import matplotlib.pyplot as plt

    path = utilisation_plot(recs, tmp_path / "u.png", title="fixture")
    assert_sensible_png(path, min_h=600)  # four panels: CPU, GPU util, memory, power
    plt.close("all")


def test_utilisation_plot_cpu_only(tmp_path):
    recs = [{"kind": "util", "time": 10.0 + i, "node_rank": n, "cpu_percent": 50.0 + n, "gpu": []}
            for i in range(5) for n in range(2)]
    assert_sensible_png(utilisation_plot(recs, tmp_path / "cpu.png"))


def test_utilisation_plot_needs_records(tmp_path):
    with pytest.raises(UsageError, match="no utilisation records"):
        utilisation_plot([], tmp_path / "none.png")


def test_plot_run_for_show(tmp_path):
    fx = Fixture(tmp_path)
    with_util = fx.run(2, gpn=1, train_s=5.0, sps=100.0, util=[util(0, 50, 60), util(1, 55, 65)] * 3)
    without = fx.run(1, train_s=5.0, sps=100.0)
    out = plot_run(fx.ledger, with_util, tmp_path / "show.png")
    assert_sensible_png(out)
    with pytest.raises(UsageError, match="no utilisation records"):
        plot_run(fx.ledger, without, tmp_path / "no.png")
    with pytest.raises(UsageError, match="not in the ledger"):
        plot_run(fx.ledger, "nope", tmp_path / "no.png")


def test_scaling_plots_and_report_for_seed_003(tmp_path):
    fx = seed_003(tmp_path)
    summary = fx.summary()
    findings = diagnose(summary)
    out = tmp_path / "report"
    plots = scaling_plots(summary, out)
    assert set(plots) == {"time", "cost", "efficiency", "throughput"}
    for p in plots.values():
        assert_sensible_png(p)
    md = write_report(out, summary, findings, sweep_id="seed-003",
                      util_runs=[("r-x", "2 nodes", [{"kind": "util", "time": 1.0, "node_rank": 0, "cpu_percent": 9.0,
                                                       "gpu": []}])])
    text = md.read_text()
    for name in ("time_vs_nodes.png", "cost_vs_nodes.png", "efficiency_vs_nodes.png", "throughput_vs_nodes.png",
                 "util_r-x.png"):
        assert f"]({name})" in text and (out / name).exists()
    assert "| 4 | 4 |" in text  # the size table
    assert "negative-scaling" in text and "data-not-sharded" in text
    # priced by the cost engine: 4 nodes x $10.68/h (n1-standard-16 + 4 V100) over the instances' ledger
    # lifetime (provision to teardown, 108.0 s), not the 102.795 s of training alone
    assert "$1.2816" in text


def test_report_with_cpu_vs_gpu(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, gpn=0, train_s=100.0, sps=10.0)
    fx.run(1, gpn=1, train_s=10.0, sps=100.0)
    fx.run(2, gpn=1, train_s=5.5, sps=180.0)
    summary = fx.summary()
    md = write_report(tmp_path / "r", summary, [], sweep_id="s", comparisons=compare_cpu_gpu(summary))
    text = md.read_text()
    assert "## CPU vs GPU" in text and "10.0x" in text
    assert "No size fell below efficiency" in text


def test_report_survives_a_size_where_every_run_failed(tmp_path):
    fx = Fixture(tmp_path)
    fx.run(1, train_s=10.0, sps=100.0)
    fx.run(2, train_s=1.0, sps=1.0, status="failed")
    summary = fx.summary()
    two = next(r for r in summary if r.nodes == 2)
    assert two.efficiency is None and two.train_s is None and len(two.failed) == 1
    text = write_report(tmp_path / "r", summary, diagnose(summary), sweep_id="s").read_text()
    assert "| 2 | CPU | 0/1 |" in text
    for p in (tmp_path / "r").glob("*.png"):
        assert_sensible_png(p)


def test_a_short_run_is_drawn_in_the_run_s_time_with_its_phases():
    """A run of 15 s whose two nodes sampled 0.007 s apart once each (the sampler's stop sample):
    the x axis spans the run, not 0.007 s; every sample is a marker; the phases are named."""
    import matplotlib.pyplot as plt

    from gpucluster.costing.plots import utilisation_figure

    t0 = 1000.0
    recs = [{"kind": "util", "time": t0 + 12.300, "node_rank": 0, "cpu_cores": 0.9, "cpu_percent": 45.0,
             "cpu_scope": "node", "gpu": []},
            {"kind": "util", "time": t0 + 12.307, "node_rank": 1, "cpu_cores": 0.1, "cpu_percent": 5.0,
             "cpu_scope": "node", "gpu": []}]
    phases = [("provision", 0.0, 0.1), ("rendezvous", 0.2, 11.8), ("train", 11.8, 13.9), ("teardown", 14.0, 15.2)]
    fig = utilisation_figure(recs, "short", t0=t0, phases=phases)
    ax = fig.axes[0]
    lo, hi = ax.get_xlim()
    assert lo <= 0 and hi >= 15.2
    assert fig.axes[-1].get_xlabel() == "seconds since the run started"
    assert "cores busy" in ax.get_ylabel()
    lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("node")]
    assert [ln.get_marker() for ln in lines] == ["o", "o"]
    assert [float(ln.get_xdata()[0]) for ln in lines] == pytest.approx([12.300, 12.307])
    assert {"rendezvous", "train"} <= {t.get_text() for t in ax.texts}
    plt.close(fig)


def test_the_cost_plot_draws_one_bar_per_run_and_no_line():
    import matplotlib.pyplot as plt

    from gpucluster.costing.report import report_figure

    rep = {"total": "3.5", "runs": [
        {"run_id": f"r20261126-00000{i}-aaaaaa", "cloud": c, "cost": str(v), "wall_s": w, "still_billing": i == 2}
        for i, (c, v, w) in enumerate([("aws", 1.0, 600), ("gcp", 2.0, 1200), ("aws", 0.5, 60)])]}
    fig = report_figure(rep)
    top, bottom = fig.axes
    assert len(top.patches) == 3 and len(bottom.patches) == 3
    assert top.get_lines() == [] and bottom.get_lines() == []  # unrelated runs are never joined
    assert [t.get_text() for t in bottom.get_xticklabels()] == [r["run_id"] for r in rep["runs"]]
    assert any(t.get_text() == "still billing" for t in top.texts)
    plt.close(fig)
