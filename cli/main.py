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


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="gpucluster")
def cli() -> None:
    """Provision GPU clusters, train across them with torchrun, tear down, report the cost.

    \b
    Quick start (no cloud needed):
      gpucluster run --cloud local --nodes 4
      gpucluster runs
      gpucluster show RUN_ID
    """


def _register() -> None:
    from gpucluster.cli import cluster as cluster_cmds
    from gpucluster.cli import cost as cost_cmds
    from gpucluster.cli import runs as runs_cmds
    from gpucluster.cli import sweep as sweep_cmds

    cli.add_command(runs_cmds.run)
    cli.add_command(runs_cmds.runs)
    cli.add_command(runs_cmds.show)
    cli.add_command(cost_cmds.prices)
    cli.add_command(cost_cmds.cost)
    cli.add_command(sweep_cmds.sweep)
    for name in ("up", "down", "status", "logs", "gc", "doctor"):
        cli.add_command(getattr(cluster_cmds, name))


_register()


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
