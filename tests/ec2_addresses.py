"""Elastic IPs and multi-interface instances as EC2 treats them, where moto is kinder (test-only).

THIS IS A TEST DOUBLE, part of the EC2 that keeps time (tests/ec2_timed.py: `TimedEc2` mixes this in;
its handlers run in front of moto for every boto3 client of the process). moto 5.2 allocates any number
of addresses, releases an associated address by disassociating it silently, and gives every instance a
public IPv4 whatever its interfaces. EC2 does not; each behaviour and its public source:

- An instance launched with more than one network interface gets no public IPv4 at launch; it has one
  only while an Elastic IP is associated with it (EC2 API Reference,
  InstanceNetworkInterfaceSpecification.AssociatePublicIpAddress: "The public IP address can only be
  assigned to a network interface for eth0 ... You cannot specify more than one network interface in the
  request"; aws/aws-parallelcluster#7457: "AWS can't auto-assign a public IP to instances with more than
  one network interface"). A template that asks for one anyway is refused (ec2_timed.py, CreateFleet).
- AllocateAddress beyond the region's Elastic IP quota ("EC2-VPC Elastic IPs", L-0263D0A3, default 5 per
  region: VPC User Guide, "Amazon VPC quotas") fails `AddressLimitExceeded` "The maximum number of
  addresses has been reached." (EC2 API Reference, "Error codes": AddressLimitExceeded, "You've reached
  the limit on the number of Elastic IP addresses that you can allocate").
- AssociateAddress by instance id on an instance with several interfaces fails `InvalidInstanceID`
  (AssociateAddress: "If the instance has more than one network interface, you must specify a network
  interface ID"); by the interface's id it works.
- ReleaseAddress of an address still associated fails `InvalidIPAddress.InUse` (ReleaseAddress:
  "[Nondefault VPC] You must use DisassociateAddress to disassociate the Elastic IP address before you can
  release it. Otherwise, Amazon EC2 returns an error (InvalidIPAddress.InUse)"); terminating the instance
  disassociates it (EC2 User Guide, "Elastic IP addresses": an address is disassociated when its instance
  is terminated).
"""

from __future__ import annotations

from typing import Any


class Addresses:
    """The Elastic IP rules; `TimedEc2` provides `instances`, `clock`, `_raw`, `_refuse`, `lock`."""

    eip_quota_default = 5

    def _addresses_init(self) -> None:
        self.eip_quota = self.eip_quota_default  # per region, as the account's applied quota
        self.associated: dict[str, tuple[str, str]] = {}  # allocation id -> (association id, instance id)

    def _attached_to(self, client: Any, params: dict[str, Any]) -> str | None:
        if params.get("InstanceId"):
            return str(params["InstanceId"])
        enis = self._raw(client, "DescribeNetworkInterfaces", {"NetworkInterfaceIds": [params["NetworkInterfaceId"]]})
        return next(((n.get("Attachment") or {}).get("InstanceId") for n in enis.get("NetworkInterfaces", [])), None)

    def _live_association(self, alloc: str) -> tuple[str, str] | None:
        held = self.associated.get(alloc)
        inst = self.instances.get(held[1]) if held else None
        if held and inst is not None and inst.state(self.clock.now()) == "terminated":
            self.associated.pop(alloc)  # EC2 disassociated it with the termination
            return None
        return held

    def has_address(self, iid: str) -> bool:
        return any(self._live_association(a) and self.associated[a][1] == iid for a in list(self.associated))

    def _AllocateAddress(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        held = self._raw(client, "DescribeAddresses", {}).get("Addresses", [])
        if len(held) >= self.eip_quota:
            raise self._refuse("AllocateAddress", "", "AddressLimitExceeded",
                               "The maximum number of addresses has been reached.")
        return real()

    def _AssociateAddress(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        iid = self._attached_to(client, params)
        inst = self.instances.get(iid or "")
        if inst is not None and inst.multi and not params.get("NetworkInterfaceId"):
            raise self._refuse("AssociateAddress", iid or "", "InvalidInstanceID",
                               f"There are multiple interfaces attached to instance '{iid}'. Please specify an "
                               "interface ID for the operation instead.")
        resp = real()
        if params.get("AllocationId") and iid:
            self.associated[params["AllocationId"]] = (resp.get("AssociationId", ""), iid)
        return resp

    def _DisassociateAddress(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        resp = real()
        for alloc, (assoc, _) in list(self.associated.items()):
            if assoc == params.get("AssociationId"):
                self.associated.pop(alloc)
        return resp

    def _ReleaseAddress(self, client: Any, params: dict[str, Any], real: Any) -> Any:
        alloc = params.get("AllocationId", "")
        if self._live_association(alloc):
            raise self._refuse("ReleaseAddress", alloc, "InvalidIPAddress.InUse", f"Address {alloc} is in use.")
        return real()
