"""`GpuCluster`: a Pulumi component for an EC2 g5 cluster in one subnet, one AZ, one placement group.

What one component declares (every child has `parent=self` and the cluster's tags where AWS
allows tags):

- an explicit AWS provider for the spec's region (so `gpucluster:region` decides, not whatever
  `aws:region` or AWS_REGION happens to say);
- network: a new VPC + internet gateway + route table + one subnet in one AZ where the type is
  offered, or the existing subnet named by option `subnetId` (with `vpcId`);
- a security group: all traffic between members (NCCL/gloo use ephemeral ports both ways), all
  egress, SSH only from `spec.ssh_cidr` (0.0.0.0/0 only with option `allowOpenSsh=true`,
  enforced by the catalog's validation);
- a cluster placement group;
- the login key: generated with pulumi-tls (the private key only ever as a secret output) or
  the user's public key from option `sshPublicKey`;
- only when the nodes need one (`catalog.role_reasons`): an IAM role + instance profile (under
  the IAM path /gpucluster/<owner>/<region>/<cluster>/, so the leftover scan finds them by owner and
  cluster), with one inline role policy granting exactly the spec's s3 prefixes (options s3Read /
  s3Write, set by `run --data s3://...` / `--output s3://...`; `infra.aws.s3.policy_document`: the
  nodes use the instance role's credentials, no keys are ever copied to them) and, with option
  `ssm=true`, AmazonSSMManagedInstanceCore. A default run creates no IAM and needs no `iam:PassRole`;
- one launch template and one EC2 Fleet of type `instant` that launches all N nodes in one
  request, all or none (min_target_capacity = N, one type, one zone), of the latest x86_64 PyTorch DLAMI ("Deep Learning OSS Nvidia Driver AMI GPU
  PyTorch 2.* (Ubuntu 22.04 or 24.04)", torch at /opt/pytorch/bin/python); option `image=base` picks the
  Base OSS Nvidia Driver DLAMI plus a user-data step that installs torch at that path; option
  `ami` overrides the lookup, IMDSv2 required, encrypted gp3 root, shutdown =
  terminate, optional spot that terminates on interruption; interface 0 in the cluster's subnet with
  a public IPv4 assigned at launch (with option `efa=true` an EFA interface; on a type with several
  network cards one EFA interface per card, and then an Elastic IP per node: interfaces.py). Each
  node generates its own host key; the launcher reads it from the serial console
  (`infra.aws.hostkeys`), never trusting on first use;
- user data that arms a dead-man switch on every boot (power off, hence terminate, at first
  boot + max lifetime) and writes a readiness marker after checking the GPU count
  (`infra.aws.user_data`).

`declare(spec)` builds the component and returns the outputs `infra.program` exports.
"""

from __future__ import annotations

import base64
import json
import operator
from typing import Optional

import pulumi
import pulumi_aws as aws
import pulumi_tls as tls

from gpucluster.infra.aws import catalog, s3
from gpucluster.errors import ProvisionError
from gpucluster.spec import ClusterSpec

from .efa import cards as efa_cards
from .engine import PROVIDER_MAX_RETRIES, fleet_instance_ids
from .interfaces import node_addresses, template_interfaces
from .kms import KEYS_OPTION, keys_of
from .leftovers import iam_path
from .catalog import role_reasons
from .rootdisk import ROOT_GB_TAG, root_disk_gb, snapshot_gb
from .user_data import READY_FILE, render_user_data

TYPE_TOKEN = "gpucluster:aws:GpuCluster"

AMI_NAME_PATTERNS = catalog.IMAGES[catalog.DEFAULT_IMAGE]
AMI_OWNERS = ("amazon",)
SSM_POLICY_ARN = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
DEFAULT_VPC_CIDR = "10.42.0.0/16"
# the root device of a pinned `ami`: Ubuntu AMIs, the DLAMIs included, name it /dev/sda1; a
# looked-up AMI's own `root_device_name` is used instead
DEFAULT_ROOT_DEVICE = "/dev/sda1"
# the inputs whose change replaces the nodes' launch template, and the instant fleet (issue 40 item 2;
# its tags alone are updated in place, which EC2 allows: CreateTags)
TEMPLATE_REPLACED_ON = ("image_id", "user_data", "tag_specifications", "iam_instance_profile", "block_device_mappings",
                        "network_interfaces", "placement", "key_name", "metadata_options",
                        "instance_initiated_shutdown_behavior")
FLEET_REPLACED_ON = ("launch_template_configs", "target_capacity_specification", "on_demand_options", "spot_options")

class GpuCluster(pulumi.ComponentResource):
    """N g5 instances, head first, in one subnet/AZ/placement group (see the module docstring)."""

    def __init__(
        self,
        name: str,
        *,
        spec: ClusterSpec,
        opts: Optional[pulumi.ResourceOptions] = None,
    ) -> None:
        super().__init__(TYPE_TOKEN, name, None, opts)
        self.spec = spec
        self.itype = catalog.instance_type_of(spec)
        self.region = catalog.region_of(spec)
        self.efa = catalog.efa_requested(spec)
        self.cards = efa_cards(spec)  # network cards given an EFA interface (efa.py)
        base_tags = spec.managed_tags()  # with the owner marks: owner id, user, host (gpucluster.ownership)
        self._base_tags = base_tags
        self._iam_path = iam_path(base_tags.get("gpucluster-owner"), self.region, spec.name)

        # An explicit provider does not read the stack's `aws:` config by itself: pass on the
        # profile a user may have set there (credentials from the environment work unchanged).
        self._provider = aws.Provider(
            f"{name}-provider",
            region=self.region,
            profile=pulumi.Config("aws").get("profile"),
            # capacity errors reach us within seconds, not after minutes of retries (engine.py)
            max_retries=PROVIDER_MAX_RETRIES,
            opts=pulumi.ResourceOptions(parent=self),
        )
        invoke_opts = pulumi.InvokeOutputOptions(parent=self, provider=self._provider)

        vpc_id, subnet_id = self._network(name, spec, invoke_opts)
        self.subnet_id = pulumi.Output.from_input(subnet_id)
        sg = self._security_group(name, spec, vpc_id)
        self.security_group = sg

        # -- placement group, keys, IAM ----------------------------------------------------
        pg = aws.ec2.PlacementGroup(
            f"{name}-pg", strategy="cluster", tags=self._tags(f"{spec.name}-pg"), opts=self._opts()
        )
        key_pair = aws.ec2.KeyPair(
            f"{name}-key", public_key=self._login_key(name, spec), tags=self._tags(f"{spec.name}-key"),
            opts=self._opts()
        )
        s3_scopes = s3.scopes(spec)
        self.s3_policy: Optional[aws.iam.RolePolicy] = None
        profile = self._node_role(name, spec, s3_scopes) if role_reasons(spec) else None
        self._role_deps = [d for d in (self._ssm, self.s3_policy) if d is not None] if profile else []

        # -- instances ---------------------------------------------------------------------
        ami_opt = catalog.option(spec, "ami")
        self.ami = (
            None
            if ami_opt
            else aws.ec2.get_ami_output(
                most_recent=True,
                owners=list(AMI_OWNERS),
                filters=[
                    aws.ec2.GetAmiFilterArgs(name="name", values=catalog.ami_name_patterns(spec)),
                    aws.ec2.GetAmiFilterArgs(name="architecture", values=["x86_64"]),
                    aws.ec2.GetAmiFilterArgs(name="state", values=["available"]),
                ],
                opts=invoke_opts,
            )
        )
        self.ami_id: pulumi.Output[str] = (pulumi.Output.from_input(str(ami_opt)) if self.ami is None
                                           else self.ami.id)
        # -- the nodes: one launch template, one EC2 Fleet of type instant ----------------------
        # All nodes in one request, all or none: an instant fleet is one synchronous CreateFleet
        # call, and with min_target_capacity equal to the target (which needs single_instance_type
        # and single_availability_zone) EC2 launches every node or none (EC2 API reference,
        # OnDemandOptionsRequest/SpotOptionsRequest: "MinTargetCapacity: the minimum target
        # capacity ... in the fleet. If the minimum target capacity is not reached, the fleet
        # launches no instances"). One template means one user data for all nodes, so no node
        # carries a host key of ours: each generates its own, cloud-init prints it to the serial
        # console, and the launcher pins it from GetConsoleOutput (`infra.aws.hostkeys`).
        self.instance_tags = self._tags(f"{spec.name}-node")
        user_data = render_user_data(
            cluster=spec.name,
            expected_gpus=self.itype.gpus,
            max_lifetime_minutes=spec.max_lifetime_minutes,
            setup_torch=catalog.image_of(spec) == "base" and not ami_opt,
            idle_minutes=catalog.idle_minutes(spec),
        )
        self.user_data = user_data
        self.launch_template = self._node_template(name, spec, subnet_id, sg, pg, key_pair, profile, user_data)
        capacity_type = "spot" if spec.spot else "on-demand"
        self.fleet = aws.ec2.Fleet(
            f"{name}-fleet",
            type="instant",
            launch_template_configs=[aws.ec2.FleetLaunchTemplateConfigArgs(
                launch_template_specification=aws.ec2.FleetLaunchTemplateConfigLaunchTemplateSpecificationArgs(
                    launch_template_id=self.launch_template.id,
                    version=self.launch_template.latest_version.apply(str),
                ),
                overrides=[aws.ec2.FleetLaunchTemplateConfigOverrideArgs(
                    instance_type=self.itype.name, availability_zone=self.availability_zone)],
            )],
            target_capacity_specification=aws.ec2.FleetTargetCapacitySpecificationArgs(
                default_target_capacity_type=capacity_type,
                total_target_capacity=spec.nodes,
                spot_target_capacity=spec.nodes if spec.spot else None,
                on_demand_target_capacity=None if spec.spot else spec.nodes,
            ),
            # all or none: at least every node, of one type, in one zone
            on_demand_options=None if spec.spot else aws.ec2.FleetOnDemandOptionsArgs(
                min_target_capacity=spec.nodes, single_instance_type=True, single_availability_zone=True),
            spot_options=aws.ec2.FleetSpotOptionsArgs(
                instance_interruption_behavior="terminate", min_target_capacity=spec.nodes, single_instance_type=True,
                single_availability_zone=True) if spec.spot else None,
            # an instant fleet's instances are terminated with it (DeleteFleets, TerminateInstances)
            terminate_instances=True,
            # the nodes' root size, as the cost records read it (engine.resource_detail): sized for the image
            tags={**self._tags(f"{spec.name}-fleet"), ROOT_GB_TAG: self.root_gb.apply(str)},
            # An update that changes the nodes (a new DLAMI, new tags: a new template) replaces the
            # fleet, the old one deleted first (its nodes terminate, the new ones launch): EC2 modifies
            # only `maintain` fleets (ModifyFleet: FleetNotInModifiableState for an instant one), and the
            # provider would modify it in place (issue 40 item 2)
            opts=self._opts(depends_on=[*self._role_deps, *self._network_deps, *self._rule_deps],
                            replace_on_changes=list(FLEET_REPLACED_ON), delete_before_replace=True),
        )
        region = self.region
        def ranked(both: list[object]) -> list[str]:  # [the fleet's id, its fleet_instance_sets]
            fleet_id, sets = both
            return fleet_instance_ids(sets if isinstance(sets, list) else None, spec.nodes,
                                      fleet_id=fleet_id if isinstance(fleet_id, str) else None, region=region)

        ids = pulumi.Output.all(self.fleet.id, self.fleet.fleet_instance_sets).apply(ranked)
        self.instance_ids = ids
        hosts = [aws.ec2.get_instance_output(instance_id=ids.apply(operator.itemgetter(rank)), opts=invoke_opts)
                 for rank in range(spec.nodes)]
        self.private_ips = pulumi.Output.all(*[h.private_ip for h in hosts])
        # several interfaces (EFA on every card): no public IPv4 at launch, an Elastic IP each (interfaces.py)
        self.public_ips = pulumi.Output.all(*(
            node_addresses(name, spec.name, hosts, self._tags,
                           lambda: self._opts(depends_on=[self.fleet, *self._network_deps]))
            if self.cards > 1 else [h.public_ip for h in hosts]))
        self.register_outputs(self.outputs())

    # -- helpers -------------------------------------------------------------------------------
    def _network(self, name: str, spec: ClusterSpec,
                 invoke_opts: pulumi.InvokeOutputOptions) -> tuple[pulumi.Input[str], pulumi.Input[str]]:
        """(VPC id, subnet id): option subnetId's, else a new VPC with one public subnet in the zone.
        Sets `availability_zone` and `_network_deps` (what the nodes wait for)."""
        subnet_id_opt = catalog.option(spec, "subnetId")
        self._network_deps: list[pulumi.Resource] = []
        if subnet_id_opt:
            existing = aws.ec2.get_subnet_output(id=subnet_id_opt, opts=invoke_opts)
            vpc_id: pulumi.Input[str] = existing.vpc_id
            subnet_id: pulumi.Input[str] = subnet_id_opt
            self.availability_zone: pulumi.Output[str] = existing.availability_zone
        else:
            self.availability_zone = (
                pulumi.Output.from_input(spec.zone)
                if spec.zone
                else self._first_zone_offering(invoke_opts)
            )
            cidr = catalog.option(spec, "vpcCidr", DEFAULT_VPC_CIDR)
            vpc = aws.ec2.Vpc(
                f"{name}-vpc",
                cidr_block=cidr,
                enable_dns_hostnames=True,
                enable_dns_support=True,
                tags=self._tags(f"{spec.name}-vpc"),
                opts=self._opts(),
            )
            igw = aws.ec2.InternetGateway(
                f"{name}-igw", vpc_id=vpc.id, tags=self._tags(f"{spec.name}-igw"), opts=self._opts()
            )
            subnet = aws.ec2.Subnet(
                f"{name}-subnet",
                vpc_id=vpc.id,
                cidr_block=cidr,
                availability_zone=self.availability_zone,
                map_public_ip_on_launch=True,
                tags=self._tags(f"{spec.name}-subnet"),
                opts=self._opts(),
            )
            routes = aws.ec2.RouteTable(
                f"{name}-routes",
                vpc_id=vpc.id,
                routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)],
                tags=self._tags(f"{spec.name}-routes"),
                opts=self._opts(),
            )
            assoc = aws.ec2.RouteTableAssociation(
                f"{name}-routes-assoc", subnet_id=subnet.id, route_table_id=routes.id, opts=self._opts()
            )
            vpc_id, subnet_id = vpc.id, subnet.id
            self._network_deps = [igw, assoc]
        return vpc_id, subnet_id

    def _security_group(self, name: str, spec: ClusterSpec, vpc_id: pulumi.Input[str]) -> "aws.ec2.SecurityGroup":
        """The cluster's security group and its rules (kept in `_rule_deps`)."""
        sg = aws.ec2.SecurityGroup(
            f"{name}-sg",
            vpc_id=vpc_id,
            description=f"gpucluster {spec.name}: all traffic between members, SSH from the caller",
            tags=self._tags(f"{spec.name}-sg"),
            opts=self._opts(),
        )
        # the rules are resources of their own: the nodes' template and fleet depend on them, so no node
        # boots before its egress and the members' (EFA) rules exist (issue 40 item 12)
        self._rule_deps: list[pulumi.Resource] = []
        self._rule_deps.append(aws.vpc.SecurityGroupIngressRule(
            f"{name}-in-members",
            security_group_id=sg.id,
            referenced_security_group_id=sg.id,
            ip_protocol="-1",
            description="all traffic between cluster members (rendezvous, NCCL, gloo, EFA)",
            tags=self._tags(f"{spec.name}-in-members"),
            opts=self._opts(),
        ))
        self._rule_deps.append(aws.vpc.SecurityGroupEgressRule(
            f"{name}-out-members",
            security_group_id=sg.id,
            referenced_security_group_id=sg.id,
            ip_protocol="-1",
            description="all traffic to cluster members (EFA needs this rule explicitly)",
            tags=self._tags(f"{spec.name}-out-members"),
            opts=self._opts(),
        ))
        self._rule_deps.append(aws.vpc.SecurityGroupEgressRule(
            f"{name}-out-all",
            security_group_id=sg.id,
            cidr_ipv4="0.0.0.0/0",
            ip_protocol="-1",
            description="outbound: package mirrors, data, SSM",
            tags=self._tags(f"{spec.name}-out-all"),
            opts=self._opts(),
        ))
        if spec.ssh_cidr:  # IPv4 only: validate_spec refuses an IPv6 CIDR (the VPC has no IPv6)
            self._rule_deps.append(aws.vpc.SecurityGroupIngressRule(
                f"{name}-in-ssh",
                security_group_id=sg.id,
                cidr_ipv4=spec.ssh_cidr,
                ip_protocol="tcp",
                from_port=22,
                to_port=22,
                description="SSH from the caller",
                tags=self._tags(f"{spec.name}-in-ssh"),
                opts=self._opts(),
            ))
        return sg

    def _login_key(self, name: str, spec: ClusterSpec) -> pulumi.Input[str]:
        """The public key the nodes admit: option sshPublicKey's, else a new ED25519 key's (its private
        half a secret output)."""
        user_key = catalog.option(spec, "sshPublicKey")
        if user_key:
            self.ssh_private_key: pulumi.Output[Optional[str]] = pulumi.Output.secret(None)
            return str(user_key)
        login = tls.PrivateKey(
            f"{name}-login-key", algorithm="ED25519", opts=pulumi.ResourceOptions(parent=self)
        )
        self.ssh_private_key = pulumi.Output.secret(login.private_key_openssh)
        return login.public_key_openssh

    def _node_role(self, name: str, spec: ClusterSpec,
                   s3_scopes: tuple[list[str], list[str]]) -> "aws.iam.InstanceProfile":
        """The nodes' instance role and profile, made only for a reason (`catalog.role_reasons`):
        the s3 grants of the spec (one inline policy), and with option `ssm=true` the SSM core policy."""
        ssm_wanted = catalog.flag(spec, "ssm")
        role = aws.iam.Role(
            f"{name}-role",
            assume_role_policy=json.dumps({"Version": "2012-10-17", "Statement": [{
                "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}),
            description=f"gpucluster {spec.name} nodes: " + ", ".join(
                (["S3 read/write of the run's --data/--output prefixes"] if any(s3_scopes) else [])
                + (["SSM core"] if ssm_wanted else [])),
            path=self._iam_path,  # found by owner, region and cluster, never by an account-wide sweep
            tags=self._tags(f"{spec.name}-role"),
            opts=self._opts(),
        )
        self._ssm = (aws.iam.RolePolicyAttachment(f"{name}-ssm", role=role.name, policy_arn=SSM_POLICY_ARN,
                                                  opts=self._opts()) if ssm_wanted else None)
        if any(s3_scopes):
            # inline: it lives and dies with the role (IAM deletes a role only once its inline
            # policies are gone; Pulumi deletes this one first, `gc` does too: leftovers.py)
            self.s3_policy = aws.iam.RolePolicy(
                f"{name}-s3",
                role=role.id,
                policy=json.dumps(s3.policy_document(*s3_scopes, partition=s3.partition_of(self.region),
                                                     kms_keys=keys_of(catalog.option(spec, KEYS_OPTION)))),
                opts=self._opts(),
            )
        return aws.iam.InstanceProfile(
            f"{name}-profile", role=role.name, path=self._iam_path, tags=self._tags(f"{spec.name}-profile"),
            opts=self._opts()
        )

    def _tags(self, name: str, **extra: str) -> dict[str, str]:
        return {**self._base_tags, "Name": name, **extra}

    def _opts(self, *, depends_on: Optional[list[pulumi.Resource]] = None, replace_on_changes: Optional[list[str]] = None,
              delete_before_replace: Optional[bool] = None) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, provider=self._provider, depends_on=depends_on,
                                      replace_on_changes=replace_on_changes, delete_before_replace=delete_before_replace)

    def _node_template(self, name: str, spec: ClusterSpec, subnet_id: pulumi.Input[str], sg: aws.ec2.SecurityGroup,
                       pg: aws.ec2.PlacementGroup, key_pair: aws.ec2.KeyPair,
                       profile: Optional[aws.iam.InstanceProfile], user_data: str) -> aws.ec2.LaunchTemplate:
        """The one launch template every node of the fleet is launched from: the AMI, the login key,
        IMDSv2 required, an encrypted gp3 root deleted on termination, shutdown = terminate, the
        placement group, the instance profile when there is one, the tags of the instances and their
        volumes and interfaces, and the shared user data. Interface 0 is in the cluster's subnet and
        security group; with option efa=true it is an EFA interface, and a type with several network
        cards gets an `efa-only` interface on each further card, and then no public IPv4 at launch
        (an Elastic IP per node instead: interfaces.py, efa.py)."""
        root_device = (self.ami.root_device_name if self.ami is not None
                       else pulumi.Output.from_input(DEFAULT_ROOT_DEVICE))
        # --disk-gb as given, else sized for the image: max(100, its root snapshot + 25) (rootdisk.py)
        # (a pinned `ami` is read by its id for that, and only then)
        if spec.disk_gb is not None:
            self.root_gb: pulumi.Output[int] = pulumi.Output.from_input(int(spec.disk_gb))
        else:
            sized_by = self.ami if self.ami is not None else aws.ec2.get_ami_output(
                filters=[aws.ec2.GetAmiFilterArgs(name="image-id", values=[str(catalog.option(spec, "ami"))])],
                opts=pulumi.InvokeOutputOptions(parent=self, provider=self._provider))
            self.root_gb = sized_by.apply(_sized_for)
        return aws.ec2.LaunchTemplate(
            f"{name}-nodes",
            description=f"{spec.name} nodes",
            image_id=self.ami_id,
            key_name=key_pair.key_name,
            iam_instance_profile=(aws.ec2.LaunchTemplateIamInstanceProfileArgs(name=profile.name)
                                  if profile is not None else None),
            metadata_options=aws.ec2.LaunchTemplateMetadataOptionsArgs(http_endpoint="enabled",
                                                                       http_tokens="required"),
            block_device_mappings=[aws.ec2.LaunchTemplateBlockDeviceMappingArgs(
                device_name=root_device,
                ebs=aws.ec2.LaunchTemplateBlockDeviceMappingEbsArgs(
                    volume_type=catalog.DEFAULT_DISK_TYPE, volume_size=self.root_gb, encrypted="true",
                    delete_on_termination="true"))],
            instance_initiated_shutdown_behavior="terminate",
            placement=aws.ec2.LaunchTemplatePlacementArgs(group_name=pg.name),
            network_interfaces=template_interfaces(self.cards, self.efa, subnet_id, sg.id),
            tag_specifications=[
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type="instance", tags=self.instance_tags),
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type="volume",
                                                           tags=self._tags(f"{spec.name}-node-root")),
                aws.ec2.LaunchTemplateTagSpecificationArgs(resource_type="network-interface",
                                                           tags=self._tags(f"{spec.name}-node-eni")),
            ],
            user_data=base64.b64encode(user_data.encode()).decode(),  # a launch template takes it encoded
            tags=self._tags(f"{spec.name}-nodes"),
            # what the nodes are made of changes: a new template, and with it a new fleet (not a new
            # version of this one under a fleet EC2 cannot modify)
            opts=self._opts(depends_on=[*self._role_deps, *self._network_deps, *self._rule_deps],
                            replace_on_changes=list(TEMPLATE_REPLACED_ON)),
        )

    def _first_zone_offering(self, invoke_opts: pulumi.InvokeOutputOptions) -> pulumi.Output[str]:
        """The first zone (by name) of the region where the instance type is offered."""
        offerings = aws.ec2.get_instance_type_offerings_output(
            location_type="availability-zone",
            filters=[
                aws.ec2.GetInstanceTypeOfferingsFilterArgs(name="instance-type", values=[self.itype.name])
            ],
            opts=invoke_opts,
        )

        def pick(locations: list[str]) -> str:
            if not locations:
                raise ProvisionError(
                    f"{self.itype.name} is not offered in any availability zone of {self.region} "
                    "for this account; choose another region or set zone"
                )
            return sorted(locations)[0]

        return offerings.locations.apply(pick)

    def outputs(self) -> dict[str, pulumi.Output[object]]:
        """What the program exports (and the launcher reads): lists are head first."""
        return {
            "cluster_name": pulumi.Output.from_input(self.spec.name),
            "instance_ids": self.instance_ids,
            "private_ips": self.private_ips,
            "public_ips": self.public_ips,
            "ssh_user": pulumi.Output.from_input(catalog.SSH_USER),
            "ssh_private_key": self.ssh_private_key,
            "fleet_id": self.fleet.id,
            "region": pulumi.Output.from_input(self.region),
            "availability_zone": self.availability_zone,
            "instance_type": pulumi.Output.from_input(self.itype.name),
            "gpus_per_node": pulumi.Output.from_input(self.itype.gpus),
            "ready_file": pulumi.Output.from_input(READY_FILE),
            "node_python": pulumi.Output.from_input(catalog.NODE_PYTHON),
        }


def _sized_for(ami: aws.ec2.GetAmiResult) -> int:
    """The default root size for a looked-up AMI (`aws.ec2.get_ami`'s result; its `ebs` map has
    snake_case keys, as terraform-provider-aws's data source sets them)."""
    return root_disk_gb(None, snapshot_gb(ami.root_device_name, [
        {"DeviceName": m.device_name, "Ebs": {"VolumeSize": (m.ebs or {}).get("volume_size")}}
        for m in ami.block_device_mappings or []]))


def declare(spec: ClusterSpec) -> dict[str, pulumi.Output[object]]:
    """Declare the cluster for a validated spec; return the outputs to export."""
    return GpuCluster(spec.name, spec=spec).outputs()
