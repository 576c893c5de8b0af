"""`--dry-run` for aws: run the REAL Pulumi program (`infra.program.run`) under Pulumi's mock
runtime (`pulumi.runtime.set_mocks`, via `infra.aws.mock_runtime.build`) and describe what it would
declare, for a reviewer: resource types and counts, the security group rules, the AMI filter, a
user-data summary (never the secret host keys), the tags, and the mock outputs the per-node
commands are built from. Nothing is created and no credentials are read: the mocks answer every
provider call (the AMI id, the zones and the IPs in the answer are the mocks', said so).

`dry_run(spec) -> dict` is what `PulumiProvider.dry_run` calls; another cloud plugs in with a
module `infra/<cloud>_dryrun.py` exposing the same function.
"""

from __future__ import annotations

import base64
import json
from collections import Counter
from typing import TYPE_CHECKING
import yaml

from gpucluster.infra.aws.mock_runtime import Recorder, build, unwrap
from gpucluster.spec import ClusterSpec
from gpucluster.states import JsonMapping, JsonObject

if TYPE_CHECKING:
    from gpucluster.infra.ssh.launch import SshLauncher
    from gpucluster.watch.launch import JobSpec

SG_RULE_TYPES = {
    "aws:vpc/securityGroupIngressRule:SecurityGroupIngressRule": "ingress",
    "aws:vpc/securityGroupEgressRule:SecurityGroupEgressRule": "egress",
}


def _sg_rule(direction: str, i: JsonMapping) -> JsonObject:
    """One security group rule as the reviewer reads it."""
    lo, hi = (int(i[k]) if i.get(k) is not None else None for k in ("fromPort", "toPort"))
    ports = "all" if i.get("ipProtocol") == "-1" else (f"{lo}" if lo == hi else f"{lo}-{hi}")
    peer = i.get("cidrIpv4") or i.get("cidrIpv6") or ("members of the group" if i.get("referencedSecurityGroupId")
                                                        else "?")
    return {"direction": direction, "protocol": "all" if i.get("ipProtocol") == "-1" else i.get("ipProtocol"),
            "ports": ports, "peer": peer, "description": i.get("description", "")}


def _sg_rules(rec: Recorder) -> list[JsonObject]:
    rules = []
    for r in rec.resources:
        direction = SG_RULE_TYPES.get(r.typ)
        if direction:
            rules.append(_sg_rule(direction, r.inputs))
    return rules


def _ami_filter(rec: Recorder) -> JsonObject:
    ami = [c.args for c in rec.calls_to("aws:ec2/getAmi:getAmi")]
    if not ami:
        return {"ami": "pinned by option ami"}
    return {"owners": ami[0].get("owners"), "most_recent": ami[0].get("mostRecent"),
            **{f["name"]: f["values"] for f in ami[0].get("filters", [])}}


def _user_data(first: JsonMapping) -> JsonObject:
    """What the nodes' cloud-init does (never the secret host keys)."""
    if first.get("userData") is None:
        return {}
    doc = yaml.safe_load(base64.b64decode(unwrap(first["userData"])).decode())
    return {
        "runcmd": [" ".join(map(str, c)) for c in doc.get("runcmd", [])],
        "files": [f["path"] for f in doc.get("write_files", [])],
        "host_key": ("a new ed25519 key per node, printed to the serial console and pinned from there"
                     if "ed25519" in (doc.get("ssh_genkeytypes") or []) else None),
    }


def _object_access(rec: Recorder) -> list[JsonObject]:
    policies = [json.loads(unwrap(r.inputs["policy"])) for r in rec.of_type("aws:iam/rolePolicy:RolePolicy")]
    return [{"actions": st["Action"], "resources": st["Resource"], **({"condition": st["Condition"]}
                                                                   if "Condition" in st else {})}
            for doc in policies for st in doc.get("Statement", [])]


def _instances(fi: JsonMapping, first: JsonMapping, has_fleet: bool) -> JsonObject:
    """The fleet's instances: how many, which type, how they launch, their root disk and metadata."""
    target = fi.get("targetCapacitySpecification") or {}
    options = fi.get("onDemandOptions") or fi.get("spotOptions") or {}
    root = ((first.get("blockDeviceMappings") or [{}])[0].get("ebs") or {})
    return {
        "count": int(target.get("totalTargetCapacity") or 0),
        "type": ((fi.get("launchTemplateConfigs") or [{}])[0].get("overrides") or [{}])[0].get("instanceType"),
        "launch": (f"one EC2 Fleet request (type {fi.get('type')}), all or none: min target capacity "
                   f"{int(options.get('minTargetCapacity') or 0)}, one type, one zone") if has_fleet else None,
        "root": {k: root.get(k) for k in ("volumeType", "volumeSize", "encrypted")},
        "imds": first.get("metadataOptions", {}).get("httpTokens"),
        "shutdown": first.get("instanceInitiatedShutdownBehavior"),
        "spot": target.get("defaultTargetCapacityType") == "spot",
    }


def dry_run(spec: ClusterSpec, *, job: JobSpec | None = None, launcher: SshLauncher | None = None) -> JsonObject:
    """What the program declares under the mocks; with a job and its launcher also `node_commands`, the command
    line each node would run at the mocks' private IPs (printed by the CLI; not part of `--json`)."""
    import contextlib
    import io

    # the program's pulumi.log.warn lines repeat the spec warnings the CLI has already printed
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        built = build(spec)
    if built.error is not None:
        raise built.error
    rec = built.recorder
    counts = Counter(r.typ for r in rec.resources)
    rules = _sg_rules(rec)
    ami_filter = _ami_filter(rec)
    fleet = rec.fleet()
    template = rec.node_template()
    fi = fleet.inputs if fleet is not None else {}
    first = template.inputs if template is not None else {}
    user_data = _user_data(first)
    instance_tags = next((t.get("tags") or {} for t in first.get("tagSpecifications") or []
                          if t.get("resourceType") == "instance"), {})
    object_access = _object_access(rec)
    found, gpus = built.outputs.get("private_ips"), built.outputs.get("gpus_per_node")
    ips = [str(ip) for ip in found] if isinstance(found, (list, tuple)) else []
    commands = (launcher.preview_commands(job, ips, int(gpus) if isinstance(gpus, (int, float, str)) and gpus else 0)
                if ips and launcher is not None and job is not None else [])
    return {
        "cloud": "aws",
        "object_access": object_access,
        "resources": dict(sorted(counts.items())),
        "resource_count": len(rec.resources),
        "instances": _instances(fi, first, fleet is not None),
        "security_group_rules": rules,
        "ami_filter": ami_filter,
        "user_data": user_data,
        "tags": {k: v for k, v in instance_tags.items() if k != "Name"},
        "outputs": {k: v for k, v in built.outputs.items() if k != "ssh_private_key"},
        "note": "declared under Pulumi's mock runtime: AMI id, zone and IPs are placeholders from the mocks",
        "node_commands": commands,
    }
