"""Every command answers --help; the CLI starts without importing heavy packages."""

import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from gpucluster.cli.main import cli

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


def all_commands(group: click.Group, prefix=()):
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        path = prefix + (name,)
        yield path
        if isinstance(cmd, click.Group):
            yield from all_commands(cmd, path)


COMMANDS = list(all_commands(cli))


def test_top_level_help_lists_commands():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    names = cli.list_commands(click.Context(cli))
    assert names == sorted(names) and {"run", "up", "down", "gc", "doctor", "sweep", "cost"} <= set(names)
    for name in names:
        assert name in result.output


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) for p in COMMANDS])
def test_every_command_has_help(path):
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    assert "Example" in result.output or isinstance(cli.get_command(click.Context(cli), path[0]), click.Group)


def test_lazy_table_short_helps_match_the_commands():
    """`gpucluster --help` prints the table's short helps without importing the commands: they
    must say what each command's own docstring says."""
    from gpucluster.cli.main import COMMANDS

    ctx = click.Context(cli)
    for name, (_, short) in COMMANDS.items():
        cmd = cli.get_command(ctx, name)
        assert cmd is not None and cmd.name == name
        assert cmd.get_short_help_str(1000) == short, name
    assert cli.get_command(ctx, "nope") is None


HEAVY = ("torch", "boto3", "botocore", "pulumi", "pulumi_aws", "pulumi_gcp", "google.cloud", "kubernetes",
         "numpy", "matplotlib", "rich", "google", "psutil",
         # no command module either: --help is printed from the lazy group's table
         "gpucluster.cli.run", "gpucluster.cli.runs", "gpucluster.cli.up", "gpucluster.cli.down",
         "gpucluster.cli.gc", "gpucluster.cli.doctor", "gpucluster.cli.status", "gpucluster.cli.logs",
         "gpucluster.cli.sweep", "gpucluster.cli.cost", "gpucluster.cli.kept", "gpucluster.lifecycle.steps",
         "gpucluster.spec",
         # the dashboard's server (the `dashboard` extra) and its command module
         "starlette", "uvicorn", "jinja2", "gpucluster.cli.dashboard")


def test_help_imports_nothing_heavy():
    code = (
        "import sys, json\n"
        "from gpucluster.cli.main import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = json.loads(out.strip().splitlines()[-1])
    assert loaded == [], f"--help imported {loaded}"
