"""Every command answers --help; the CLI starts without importing heavy packages."""

import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from gpucluster.cli.main import cli


def all_commands(group: click.Group, prefix=()):
    for name, cmd in sorted(group.commands.items()):
        path = prefix + (name,)
        yield path
        if isinstance(cmd, click.Group):
            yield from all_commands(cmd, path)


COMMANDS = list(all_commands(cli))


def test_top_level_help_lists_commands():
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for name in cli.commands:
        assert name in result.output


@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) for p in COMMANDS])
def test_every_command_has_help(path):
    result = CliRunner().invoke(cli, [*path, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage:" in result.output
    assert "Example" in result.output or isinstance(cli.commands.get(path[0]), click.Group)


HEAVY = ("torch", "boto3", "botocore", "pulumi", "pulumi_aws", "pulumi_gcp", "google.cloud", "kubernetes",
         "numpy", "matplotlib", "rich")


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
