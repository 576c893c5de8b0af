"""Run the real `gpucluster` CLI (`gpucluster.cli.main.main`) on a kept gcp cluster whose Pulumi stack
outputs are read from a JSON file (FAKE_GCP_OUTPUTS: {stack name: outputs}), as `PulumiProvider.attach`
reads a stack's outputs; the kubeconfig in them points at the FAKE Kubernetes API server
(tests/k8s_fake_http.py) the test serves. Google's application-default credentials are a fixed access
token (the one the fake API server accepts), as google-auth gives a valid, unexpired token.

THIS IS A TEST DOUBLE FOR THE CLOUD, NOT FOR gpucluster: the CLI, the ledger, the gcp plugin's
launcher, `cluster_from_outputs`, `infra.gcp.gke.api_from_gke` and the kubernetes client all run for real.

    FAKE_GCP_OUTPUTS=outputs.json python tests/kept_gcp_cli.py ssh demo 1 -- nvidia-smi
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


class Stacks:
    """The stacks' outputs, as the state backend keeps them (read at each `attach`)."""

    def __init__(self, path: Path):
        self.path = path

    def attach(self, name: str):
        from gpucluster.infra.gcp.plugin import cluster_from_outputs

        outputs = json.loads(self.path.read_text()).get(name)
        return None if outputs is None else cluster_from_outputs(outputs)


def install() -> None:
    from google.oauth2.credentials import Credentials

    from gpucluster.cli import common
    from gpucluster.infra.gcp import access

    token = os.environ.get("FAKE_GCP_TOKEN", "fake-token")
    access.google_credentials = lambda credentials=None: Credentials(token=token)
    stacks = Stacks(Path(os.environ["FAKE_GCP_OUTPUTS"]))
    common.provider_for = lambda cloud, **_: stacks


if __name__ == "__main__":
    install()
    from gpucluster.cli.main import main

    sys.exit(main(sys.argv[1:]))
