"""The internal price of a kubeconfig context in config.yaml (issue 44, item 4): `kubernetes: contexts: {lab:
{price_per_gpu_hour: 2.5}}` prices that context's runs; `--option price-per-gpu-hour` wins over it, and $0 is the
default. The plan and the run's cost say which one priced it; a bad value is one line naming the key and its line,
exit 2. Only the kubeconfig file is read (a dry run reaches no API server)."""

from __future__ import annotations

from decimal import Decimal

import pytest

pytest.importorskip("kubernetes")
import yaml  # noqa: E402

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


@pytest.fixture
def kube(tmp_path, monkeypatch):
    """A kubeconfig of two contexts (lab current, prod), a home, and a config file to write."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "lab",
        "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:9"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "lab", "context": {"cluster": "c", "user": "u", "namespace": "ml"}},
                     {"name": "prod", "context": {"cluster": "c", "user": "u"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    config = tmp_path / "config.yaml"
    monkeypatch.setenv("GPUCLUSTER_CONFIG", str(config))
    return config


def _plan(capsys, *args):
    from gpucluster.cli.main import main

    code = main(["run", "--cloud", "kubernetes", "--dry-run", "--nodes", "2", "--gpus-per-node", "2", *args,
                 "--", "python", "-c", "print(1)"])
    out = capsys.readouterr()
    return code, " ".join((out.out + out.err).split())


def test_the_contexts_price_is_used_and_said(kube, capsys):
    kube.write_text("kubernetes:\n  contexts:\n    lab: {price_per_gpu_hour: 2.5}\n    prod:\n      price_per_gpu_hour: 0\n")
    code, text = _plan(capsys)
    assert code == 0, text[-3000:]
    assert "internal price $10.00/hour: $2.5/GPU-hour from config.yaml, context lab" in text, text[-3000:]
    assert f"config file '{kube}', line 3: kubernetes.contexts.lab.price_per_gpu_hour" in text, text[-3000:]
    code, text = _plan(capsys, "--option", "price-per-gpu-hour=1")  # the flag wins
    assert code == 0 and "internal price $4.00/hour: $1/GPU-hour from --option price-per-gpu-hour" in text, text[-3000:]
    assert "from config.yaml" not in text, text[-3000:]
    code, text = _plan(capsys, "--context", "prod")  # its own entry: $0, said as config's
    assert code == 0 and "internal price $0.00/hour: $0/GPU-hour from config.yaml, context prod" in text, text[-3000:]
    kube.write_text("kubernetes:\n  contexts:\n    other: {price_per_gpu_hour: 9}\n")
    code, text = _plan(capsys)  # no entry for the context: the default
    assert code == 0 and "$0 (not rented by gpucluster)" in text and "internal price" not in text, text[-3000:]


def test_the_run_cost_names_the_config_entry():
    from gpucluster.costing.internal import internal_cost
    from gpucluster.infra.registry import plugin

    kubernetes = plugin("kubernetes")
    spec = {"cloud": "kubernetes", "nodes": 2, "gpus_per_node": 2, "name": "x",
            "options": {"context": "lab", "namespace": "ml", "pricePerGpuHour": "2.5", "priceSource": "config"}}
    amount, said = internal_cost(kubernetes, spec, 3600)
    assert amount == Decimal("10.0000") and "$2.5/GPU-hour (config.yaml, context lab) × 4 GPU(s)" in said, said
    spec["options"] = {"context": "lab", "namespace": "ml", "pricePerGpuHour": "2.5"}
    assert "(--option price-per-gpu-hour)" in internal_cost(kubernetes, spec, 3600)[1]
    assert internal_cost(kubernetes, {**spec, "options": {"context": "lab"}}, 3600) is None  # none given: $0


def test_the_internal_price_is_the_cores_rule_for_backends_that_take_the_option():
    """Not a hook: a backend whose `SpecRules.options` take pricePerGpuHour gets the internal price from the
    core; one that does not (ssh, local, the clouds) gets none, even from a spec that names it."""
    from gpucluster.costing.internal import internal_cost, takes_internal_price
    from gpucluster.infra.registry import NAMES, plugin

    assert [n for n in NAMES if takes_internal_price(plugin(n))] == ["kubernetes"]
    assert not takes_internal_price(None)  # a cloud no registered backend is called
    spec = {"cloud": "ssh", "nodes": 1, "gpus_per_node": 8, "name": "x", "options": {"pricePerGpuHour": "2"}}
    assert internal_cost(plugin("ssh"), spec, 3600) is None and internal_cost(None, spec, 3600) is None
    odd = {"cloud": "kubernetes", "nodes": "many", "options": {"pricePerGpuHour": "2"}}
    assert internal_cost(plugin("kubernetes"), odd, 3600) is None  # an odd stored spec: no price


@pytest.mark.parametrize("text, expected", [
    ("kubernetes:\n  contexts:\n    lab: {price_per_gpu_hour: -1}\n",
     "line 3: kubernetes.contexts.lab.price_per_gpu_hour: -1 is not allowed: dollars per GPU-hour, 0 to 1000"),
    ("kubernetes:\n  contexts:\n    lab:\n      price_per_gpu_hour: two\n",
     "line 4: kubernetes.contexts.lab.price_per_gpu_hour: 'two' is not allowed: dollars per GPU-hour"),
    ("kubernetes:\n  contexts:\n    lab: {price-per-gpu-hour: 1}\n",
     "line 3: kubernetes.contexts.lab.price-per-gpu-hour: unknown key (did you mean \"price_per_gpu_hour\"?)"),
    ("kubernetes:\n  contexts: [lab]\n", "line 2: kubernetes.contexts: a mapping of kubeconfig context names"),
    ("kubernetes:\n  contexts:\n    lab: 2.5\n", "line 3: kubernetes.contexts.lab: a mapping of settings"),
    ("aws:\n  contexts:\n    lab: {price_per_gpu_hour: 1}\n", "line 2: unknown key 'aws.contexts'"),
])
def test_a_bad_entry_is_one_line_naming_its_key_and_line(kube, capsys, text, expected):
    kube.write_text(text)
    code, said = _plan(capsys)
    assert code == 2 and expected in said and "Traceback" not in said, said
