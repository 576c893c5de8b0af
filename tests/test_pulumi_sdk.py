"""The copy of `PulumiCommand.run` in infra/pulumi/cli.py (why a copy: its docstring) must keep
the installed SDK's signature: the SDK's workspace calls `run` positionally, so a parameter added,
renamed or reordered upstream would be passed to the wrong one. And the reason for the copy must
still hold: when upstream's `run` learns to start the CLI in its own session, the copy can go."""

import inspect

import pytest

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

pytest.importorskip("pulumi.automation")


def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_the_copied_run_has_the_installed_sdks_signature():
    """Upstream's parameters, in order, then only optional extras: `on_error` came in pulumi 3.187;
    the copy keeps it, so an SDK from the floor (3.165, which passes four) up calls it rightly."""
    from pulumi.automation import PulumiCommand

    from gpucluster.infra.pulumi.cli import detached_command_class

    ours, upstream = _params(detached_command_class().run), _params(PulumiCommand.run)
    assert ours[:len(upstream)] == upstream
    assert all(default is not inspect.Parameter.empty for _, _, default in ours[len(upstream):])


def test_upstream_run_still_offers_no_way_to_detach_the_cli():
    from pulumi.automation import PulumiCommand

    source = inspect.getsource(PulumiCommand.run)
    assert "subprocess.Popen" in source and "start_new_session" not in source and "preexec_fn" not in source
