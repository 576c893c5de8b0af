"""The nodes' network interfaces in their launch template, and their Elastic IPs (Pulumi resources).

What and why: `efa.py`. Where the association happens, and why there: in this Pulumi program, one
`aws.ec2.Eip` per node with `network_interface` = the node's primary interface (card 0), not boto3
after the fleet. So every address is in the stack's state from the moment AllocateAddress answers:

- `pulumi destroy` (the teardown, and the destroy of a failed `up` attempt) deletes each Eip before
  the fleet it refers to; pulumi-aws's delete disassociates it first, then releases it
  (terraform-provider-aws internal/service/ec2/ec2_eip.go, resourceEIPDelete: "If we are attached to
  an instance or interface, detach first", then ReleaseAddress, which EC2 refuses with
  `InvalidIPAddress.InUse` while associated);
- a create that fails after AllocateAddress (the association refused) still leaves the address in the
  state, so the same destroy releases it;
- an `up` killed between AllocateAddress and the state write leaves an address the stack does not
  know: it carries the cluster's tags from its creation (TagSpecifications), so the teardown's tag scan
  finds it, says it, and its delete disassociates and releases it (`leftovers.py`);
- the ledger records each as an `elastic-ip` resource (engine.PULUMI_KINDS), billed per address-hour.
"""

from __future__ import annotations

from typing import Callable

import pulumi
import pulumi_aws as aws

EFA_ONLY = "efa-only"


def template_interfaces(cards: int, efa: bool, subnet_id: pulumi.Input[str],
                        sg_id: pulumi.Input[str]) -> list[aws.ec2.LaunchTemplateNetworkInterfaceArgs]:
    """Card 0 / device 0: the primary (an `efa` interface with EFA on) with a public IPv4 at launch
    when it is the only one; cards 1..cards-1: one `efa-only` interface each, at device 0."""
    primary = aws.ec2.LaunchTemplateNetworkInterfaceArgs(
        device_index=0, associate_public_ip_address="true" if cards == 1 else None, delete_on_termination="true",
        subnet_id=subnet_id, security_groups=[sg_id], interface_type="efa" if efa else None)
    return [primary] + [aws.ec2.LaunchTemplateNetworkInterfaceArgs(
        device_index=0, network_card_index=card, delete_on_termination="true", subnet_id=subnet_id,
        security_groups=[sg_id], interface_type=EFA_ONLY) for card in range(1, cards)]


def node_addresses(name: str, cluster: str, hosts: list[pulumi.Output[aws.ec2.GetInstanceResult]],
                   tags: Callable[..., dict[str, str]], opts: Callable[[], pulumi.ResourceOptions]) -> list[pulumi.Output[str]]:
    """One Elastic IP per node, associated with its primary interface; the public IPs, head first.
    `tags(name, **extra)`: the cluster's tags; `opts(**kw)`: the component's resource options."""
    ips = []
    for rank, host in enumerate(hosts):
        eip = aws.ec2.Eip(
            f"{name}-ip-{rank}",
            domain="vpc",
            network_interface=host.network_interface_id,  # card 0's: an instance with several needs it named
            tags=tags(f"{cluster}-ip-{rank}", **{"gpucluster-rank": str(rank)}),
            opts=opts(),  # after the fleet and the internet gateway (an EIP needs the gateway to be associated)
        )
        ips.append(pulumi.Output.all(eip.association_id, eip.public_ip).apply(lambda both: str(both[1])))
    return ips
