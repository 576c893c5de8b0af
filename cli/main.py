"""The `gpucluster` command. Thin: parse, call the core, render.

Imports here are limited to click and gpucluster's light core so that `gpucluster --help` starts
fast; rich, torch and the cloud SDKs are imported inside the commands that need them.
"""

from __future__ import annotations

import sys

import click

from gpucluster import __version__
from gpucluster.errors import ExitCode, GpuclusterError

CONTEXT = dict(help_option_names=["-h", "--help"], max_content_width=100)

# name -> ("module:attribute", the command's short help as its docstring's first sentence gives it).
# `gpucluster --help` is printed from this table alone: no command module is imported until a
# command runs (tests/test_cli_help.py checks that the short helps match the commands).
COMMANDS: dict[str, tuple[str, str]] = {
    "budget": ("gpucluster.cli.team:budget", "A team's budget in the shared state (--state): set it, and see what the "
               "team spent against it."),
    "cost": ("gpucluster.cli.cost:cost", "Estimate costs before a run, and report what runs cost."),
    "dashboard": ("gpucluster.cli.dashboard:dashboard", "Serve a local dashboard of runs, live logs, loss curves, "
                  "clusters and costs."),
    "doctor": ("gpucluster.cli.doctor:doctor", "Check what cloud runs need: credentials, Pulumi CLI and plugins, "
               "APIs and GPU quotas, ssh client."),
    "down": ("gpucluster.cli.down:down", "Delete a cluster, then check independently (by tag, by run id) what is "
             "left (idempotent)."),
    "exec": ("gpucluster.cli.kept:exec_", "Run a new job on a kept cluster (`up`, `run --keep`): its own run, no "
             "teardown."),
    "gc": ("gpucluster.cli.gc:gc", "Find resources tagged managed-by=gpucluster that no live cluster owns; delete "
           "them after asking."),
    "gpus": ("gpucluster.cli.gpus:gpus", "List the GPUs `--gpu` takes: memory, clouds and machines, cheapest "
             "$/GPU-hour and where."),
    "logs": ("gpucluster.cli.logs:logs", "Print a run's per-node logs (node-N.log under the run's log directory)."),
    "prices": ("gpucluster.cli.cost:prices", "Show the price catalog: every row with its source and the date it was "
               "read."),
    "run": ("gpucluster.cli.run:run", "Provision a cluster, train on it with torchrun, tear it down, report."),
    "runs": ("gpucluster.cli.runs:runs", "List recorded runs, newest first."),
    "show": ("gpucluster.cli.runs:show", "Show one run: phases, nodes, metrics, resources, teardown verdict, cost."),
    "ssh": ("gpucluster.cli.kept:ssh", "Open a shell, run a command or forward ports on a node of a kept cluster."),
    "status": ("gpucluster.cli.status:status", "Clusters that may still exist: state, age, hourly and accrued cost."),
    "sweep": ("gpucluster.cli.sweep:sweep", "Run the same job at several cluster sizes and report how it scales."),
    "up": ("gpucluster.cli.up:up", "Create a cluster and leave it running (remove it with `gpucluster down NAME`)."),
}


class LazyGroup(click.Group):
    """A group whose commands are imported when used ("Lazily loading subcommands", Click docs)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        import importlib

        module, _, attr = entry[0].partition(":")
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click.Group's, from the table's short helps (no command is imported)."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        # a bare Command holding the short help shortens it exactly as the real one would
        rows = [(n, click.Command(n, help=COMMANDS[n][1]).get_short_help_str(limit)) for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="gpucluster")
def cli() -> None:
    """Provision GPU clusters, train across them with torchrun, tear down, report the cost.

    \b
    Quick start (no cloud needed):
      gpucluster run --cloud local --nodes 4
      gpucluster runs
      gpucluster show RUN_ID
    """


def main(argv: list[str] | None = None) -> int:
    """Entry point: every error becomes one line on stderr and an exit code, never a traceback."""
    try:
        rv = cli.main(args=argv, prog_name="gpucluster", standalone_mode=False)
    except GpuclusterError as exc:
        click.echo(f"gpucluster: error: {exc.message}", err=True)
        if exc.hint:
            click.echo(f"hint: {exc.hint}", err=True)
        code = int(exc.exit_code)
    except click.exceptions.UsageError as exc:
        where = f" (see '{exc.ctx.command_path} --help')" if exc.ctx else ""
        click.echo(f"gpucluster: error: {exc.format_message()}{where}", err=True)
        code = int(ExitCode.USAGE)
    except click.exceptions.Abort:
        click.echo("gpucluster: aborted", err=True)
        code = int(ExitCode.INTERRUPTED)
    except click.exceptions.ClickException as exc:
        click.echo(f"gpucluster: error: {exc.format_message()}", err=True)
        code = exc.exit_code
    except KeyboardInterrupt:
        click.echo("gpucluster: interrupted", err=True)
        code = int(ExitCode.INTERRUPTED)
    else:
        code = rv if isinstance(rv, int) else 0
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
