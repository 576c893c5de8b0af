"""EFA on every network card, and the Elastic IPs that make such nodes reachable (no SDK here).

- Interfaces: with EFA on, a node gets one EFA interface per network card: card 0 / device 0 an `efa`
  interface (EFA device plus the ENA interface with the node's IP, ssh included), every further card
  an `efa-only` interface at device 0 (an EFA device without IP traffic: it takes no address from the
  subnet). That is the layout of the EC2 User Guide, "Maximize network bandwidth on Amazon EC2
  instances with multiple network cards" (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html):
  the primary at card 0 / device 0 carries IP traffic, "for each additional network interface, use the
  next unused network card index, device index 0 for EFA-only network interface". The cards per type
  are the types' MaximumEfaInterfaces (one EFA per card; moto 5.2.5's DescribeInstanceTypes dump:
  g6e.24xlarge 2, g6e.48xlarge/p4d/p4de 4, p6-b200 8, p5en 16, p5/p5e 32; `shapes.py`).
  terraform-provider-aws accepts `efa-only` in launch templates since hashicorp/terraform-provider-aws#39882.
- Public IPv4: EC2 assigns none at launch to an instance with more than one interface
  (EC2 API Reference, InstanceNetworkInterfaceSpecification.AssociatePublicIpAddress: "You cannot
  specify more than one network interface in the request"; a subnet's auto-assign is not applied
  either, aws/aws-parallelcluster#7457). So each such node gets an Elastic IP on its primary interface
  (`interfaces.node_addresses`): allocated, associated and released by the stack, tagged like every
  resource of the cluster (the leftover scan finds them).
- Quota: "EC2-VPC Elastic IPs", Service Quotas code L-0263D0A3, default 5 per region (VPC User Guide,
  "Amazon VPC quotas"), shared by everything in the region: the preflight refuses a cluster whose
  nodes exceed the quota minus the addresses already allocated there (`address_check`).
"""

from __future__ import annotations

from gpucluster.spec import ClusterSpec
from gpucluster.states import JsonObject

from . import catalog
from .sdk import Ec2Client

EIP_QUOTA = "L-0263D0A3"  # EC2-VPC Elastic IPs (count), per region
EIP_QUOTA_NAME = "EC2-VPC Elastic IPs"
EIP_DEFAULT = 5  # the AWS default when no value was ever applied


def cards(spec: ClusterSpec) -> int:
    """Network cards given an EFA interface: every one of the type when EFA is on, else 1 (one interface)."""
    return max(1, catalog.instance_type_of(spec).efa_interfaces) if catalog.efa_requested(spec) else 1


def needs_addresses(spec: ClusterSpec) -> bool:
    """Whether the nodes need an Elastic IP each (several interfaces: no public IPv4 at launch)."""
    return cards(spec) > 1


def address_check(ec2: Ec2Client, quota: float | None, spec: ClusterSpec, region: str) -> JsonObject:
    """The preflight's row: the Elastic IP quota minus the addresses allocated in `region` must cover
    the nodes. `quota`: the applied value (None: unread, a note)."""
    name = f"EC2 quota {EIP_QUOTA} ({region})"
    itype = catalog.instance_type_of(spec)
    why = f"one per {itype.name} node: {cards(spec)} EFA network cards, no public IPv4 at launch"
    if quota is None:
        return {"check": name, "ok": None, "fix": "",
                "detail": f"could not read {EIP_QUOTA_NAME} (needs servicequotas:GetServiceQuota); the cluster needs "
                          f"{spec.nodes} Elastic IPs ({why})"}
    used = len(ec2.describe_addresses().get("Addresses", []))
    free = int(quota) - used
    if spec.nodes > free:
        return {"check": name, "ok": False,
                "detail": f"{EIP_QUOTA_NAME} in {region}: the cluster needs {spec.nodes} Elastic IPs ({why}), "
                          f"{max(free, 0)} available (quota {int(quota)}, {used} allocated)",
                "fix": f"aws service-quotas request-service-quota-increase --service-code ec2 --quota-code {EIP_QUOTA} "
                       f"--desired-value {used + spec.nodes} --region {region}, release unused addresses, or "
                       "--option efa=false (one interface with a public IPv4, no Elastic IP)"}
    return {"check": name, "ok": True, "fix": "",
            "detail": f"{EIP_QUOTA_NAME}: {free} of {int(quota)} free ({used} allocated), the cluster needs "
                      f"{spec.nodes} ({why})"}
