"""The one Pulumi program: stack config -> `ClusterSpec` -> validated -> the cloud's component.

`pulumi up -s aws-g5` (stacks/__main__.py calls `main()`) and the Automation API both run this.
Config keys live in the `gpucluster:` namespace and are read by `gpucluster.plan.stackconfig` (the
same reader `gpucluster cost estimate --stack` uses; its docstring lists the keys). The spec is
validated before any resource is declared: a bad spec declares nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpucluster.errors import SpecError
from gpucluster.infra.registry import NAMES, plugin
from gpucluster.spec import ClusterSpec, normalize, validate
from gpucluster.plan.stackconfig import GENERIC_KEYS, NAMESPACE, sanitize_name, spec_from_config
from gpucluster.states import JsonObject

if TYPE_CHECKING:
    from gpucluster.infra.contract import Plugin

__all__ = ["GENERIC_KEYS", "NAMESPACE", "main", "namespace_config", "run", "sanitize_name", "spec_from_config"]


def run(spec: ClusterSpec, chosen: Plugin | None = None) -> dict[str, Any]:
    # Any: the values are pulumi Outputs of what each component exported (`PulumiCloud.declare` gives them
    # as objects); the callers await them (`Output.future`)
    """Validate (raising before anything is declared), declare the cloud's component, export."""
    import pulumi

    chosen = chosen or plugin(spec.cloud)  # the composition root of the Pulumi program
    for warning in validate(spec, chosen):
        pulumi.log.warn(warning)
    from gpucluster.infra.pulumi.cloud import PulumiCloud

    if not isinstance(chosen.provisioner, PulumiCloud):
        raise SpecError(f"cloud {spec.cloud!r} has no Pulumi program (use the {spec.cloud} provider directly)")
    outputs = dict(chosen.provisioner.declare(spec))
    if spec.marks:  # who made the stack: `down` from a shared state refuses another owner's without --any-owner
        outputs["gpucluster_marks"] = pulumi.Output.from_input(dict(spec.marks))
        outputs["gpucluster_cloud"] = pulumi.Output.from_input(spec.cloud)  # `status` of a shared state
    for key, value in outputs.items():
        pulumi.export(key, value)
    return outputs


def namespace_config() -> JsonObject:
    """The `gpucluster:` keys of the running stack's config (prefix removed)."""
    from pulumi.runtime import config as runtime_config

    merged: JsonObject = {}
    merged.update(runtime_config.get_config_env())
    merged.update(runtime_config.CONFIG.get())
    prefix = f"{NAMESPACE}:"
    return {k[len(prefix):]: v for k, v in merged.items() if k.startswith(prefix)}


def main() -> None:
    """Entry point of stacks/__main__.py."""
    import pulumi

    config = namespace_config()
    cloud = config.get("cloud")
    if "region" not in config and cloud in NAMES:
        # the cloud provider's own `<namespace>:region` key (aws:region), where the backend has one
        from gpucluster.infra.pulumi.cloud import PulumiCloud

        provisioner = plugin(cloud).provisioner
        namespace = provisioner.region_config if isinstance(provisioner, PulumiCloud) else None
        region = pulumi.Config(namespace).get("region") if namespace else None
        if region:
            config["region"] = region
    spec = spec_from_config(config, pulumi.get_stack())
    # made without the CLI: every resource carries the owner of this machine's gpucluster home and
    # the stack (project/stack), so `gc` never sweeps it unless it is named (`gc --stack`)
    from gpucluster.ownership import stack_marks

    spec = spec.replace(marks=stack_marks(pulumi.get_project(), pulumi.get_stack()))
    # what `gpucluster run/up` fill in before the plan, the same here: on aws, an unset sshCidr
    # becomes this machine's public IPv4 /32, or the update stops (a cluster nobody can reach is
    # never made)
    chosen = plugin(spec.cloud)
    spec, notes = chosen.spec.prepare(normalize(spec, chosen))  # options in one spelling, scopes as URL fields
    for note in notes:
        pulumi.log.info(note)
    run(spec, chosen)
