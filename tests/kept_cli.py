"""Run the real `gpucluster` CLI (`gpucluster.cli.main.main`) against the FAKE Pulumi CLI
(tests/pulumi_fake.py), with the fake's stacks and outputs kept in a JSON file between commands,
as Pulumi's state backend keeps a stack between `up`, `exec`, `ssh` and `down`, each its own process.

THIS IS A TEST DOUBLE FOR THE CLOUD, NOT FOR gpucluster: everything of gpucluster runs for real
(the CLI, the lifecycle, the ledger, the Automation API driver, the ssh launcher against real sshd).

    FAKE_PULUMI_STATE=state.json FAKE_PULUMI_OUTPUTS=outputs.json python tests/kept_cli.py up ...

FAKE_PULUMI_OUTPUTS: the outputs a successful `up` exports (what EC2 would have assigned: the nodes'
addresses, host keys, the login key). FAKE_PULUMI_STEP_S: seconds each resource step takes.
The tag scan finds nothing (`test_automation.provider`): the teardown check's own tests are elsewhere.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from pulumi_fake import AWS_FLEET_RESOURCES, FakePulumiCommand  # noqa: E402


class PersistentFake(FakePulumiCommand):
    """The fake CLI whose stacks and outputs are read before, and written after, every command."""

    def __init__(self, state: Path, **kw):
        super().__init__(**kw)
        self.state = state

    def run(self, args, cwd, additional_env, on_output=None, on_error=None):
        if self.state.exists():
            data = json.loads(self.state.read_text())
            self.stacks = {k: [tuple(r) for r in v] for k, v in data["stacks"].items()}
            self.outputs = data["outputs"]
        try:
            return super().run(args, cwd, additional_env, on_output, on_error)
        finally:
            self.state.write_text(json.dumps({"stacks": self.stacks, "outputs": self.outputs}))


def install() -> PersistentFake:
    from test_automation import provider

    from gpucluster.cli import common, status

    outputs = json.loads(Path(os.environ["FAKE_PULUMI_OUTPUTS"]).read_text())
    fake = PersistentFake(Path(os.environ["FAKE_PULUMI_STATE"]), outputs=outputs, resources=AWS_FLEET_RESOURCES,
                          step_delay_s=float(os.environ.get("FAKE_PULUMI_STEP_S") or 0))
    common.provider_for = lambda cloud, **scope: provider(fake).scoped(**scope)
    # the fake cloud has no EC2 to ask whether its instances still run (tests/test_aws_status.py does)
    status.ended_resources = lambda cloud, rows, lifetime: {}
    return fake


if __name__ == "__main__":
    install()
    from gpucluster.cli.main import main

    sys.exit(main(sys.argv[1:]))
