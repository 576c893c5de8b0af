"""`gpucluster dashboard`: a local web app over the ledger (docs/dashboard.md).

Only click is imported here, so `gpucluster dashboard --help` stays fast; the server (Starlette,
uvicorn, Jinja2: the `dashboard` extra) is imported when the command runs (serve.py, app.py)."""

from __future__ import annotations

import click

from gpucluster.cli.options import Int


@click.command()
@click.option("--port", type=Int("--port", 1, 65535), default=None,
              help="Listen on this port of 127.0.0.1 [default: a random free port].")
@click.option("--no-browser", is_flag=True, help="Do not open the page in a browser; only print its URL.")
@click.option("--allow-actions", is_flag=True,
              help="Show a `down` button for each cluster (with a confirmation); read-only without it.")
def dashboard(port, no_browser, allow_actions):
    """Serve a local dashboard of runs, live logs, loss curves, clusters and costs.

    It listens on 127.0.0.1 only and prints its URL on the first line; the URL carries a random
    token, which every page needs (the browser keeps it in a cookie). Ctrl-C stops it.

    \b
    Examples:
      gpucluster dashboard
      gpucluster dashboard --port 8765 --no-browser
      gpucluster dashboard --allow-actions
    """
    from gpucluster.cli.dashboard.serve import serve

    return serve(port=port, browser=not no_browser, allow_actions=allow_actions)
