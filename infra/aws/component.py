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
- a cluster placement group; with option `efa=true` (types with EFA only) a launch template
  whose one interface is an EFA interface with a public IPv4 assigned at launch (no Elastic IP);
- the login key: generated with pulumi-tls (the private key only ever as a secret output) or
  the user's public key from option `sshPublicKey`;
- one ed25519 host key per node, generated here and installed by cloud-init from user data
  (a secret), so the launcher pins host keys instead of trusting on first use;
- only when the nodes need one (`permissions.role_reasons`): an IAM role + instance profile (under
  the IAM path /gpucluster/<owner>/<region>/<cluster>/, so the leftover scan finds them by owner and
  cluster), with one inline role policy granting exactly the spec's s3 prefixes (options s3Read /
  s3Write, set by `run --data s3://...` / `--output s3://...`; `infra.aws.s3.policy_document`: the
  nodes use the instance role's credentials, no keys are ever copied to them) and, with option
  `ssm=true`, AmazonSSMManagedInstanceCore. A default run creates no IAM and needs no `iam:PassRole`;
- N instances of the latest x86_64 PyTorch DLAMI ("Deep Learning OSS Nvidia Driver AMI GPU
  PyTorch 2.* (Ubuntu 2?.04)", torch at /opt/pytorch/bin/python); option `image=base` picks the
  Base OSS Nvidia Driver DLAMI plus a user-data step that installs torch at that path; option
  `ami` overrides the lookup, IMDSv2 required, encrypted gp3 root, shutdown =
  terminate, optional one-time spot that terminates on interruption;
- user data that arms a dead-man switch on every boot (power off, hence terminate, at first
  boot + max lifetime) and writes a readiness marker after checking the GPU count
  (`infra.aws.user_data`).

`declare(spec)` builds the component and returns the outputs `infra.program` exports.
"""

from __future__ import annotations

import json
from typing import Any, Optional

import pulumi
import pulumi_aws as aws
import pulumi_tls as tls

from gpucluster.infra.aws import catalog, s3
from gpucluster.errors import ProvisionError
from gpucluster.spec import ClusterSpec

from .engine import PROVIDER_MAX_RETRIES
from .leftovers import iam_path
from .permissions import role_reasons
from .user_data import READY_FILE, render_user_data

TYPE_TOKEN = "gpucluster:aws:GpuCluster"

AMI_NAME_PATTERN = catalog.IMAGES[catalog.DEFAULT_IMAGE]
AMI_OWNERS = ("amazon",)
SSM_POLICY_ARN = "arn:aws:iam::aws:policy/AmazonSSMManagedInstanceCore"
DEFAULT_VPC_CIDR = "10.42.0.0/16"

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

        # -- network -------------------------------------------------------------------------
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
        self.subnet_id = pulumi.Output.from_input(subnet_id)

        # -- security group ----------------------------------------------------------------
        sg = aws.ec2.SecurityGroup(
            f"{name}-sg",
            vpc_id=vpc_id,
            description=f"gpucluster {spec.name}: all traffic between members, SSH from the caller",
            tags=self._tags(f"{spec.name}-sg"),
            opts=self._opts(),
        )
        self.security_group = sg
        aws.vpc.SecurityGroupIngressRule(
            f"{name}-in-members",
            security_group_id=sg.id,
            referenced_security_group_id=sg.id,
            ip_protocol="-1",
            description="all traffic between cluster members (rendezvous, NCCL, gloo, EFA)",
            tags=self._tags(f"{spec.name}-in-members"),
            opts=self._opts(),
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-out-members",
            security_group_id=sg.id,
            referenced_security_group_id=sg.id,
            ip_protocol="-1",
            description="all traffic to cluster members (EFA needs this rule explicitly)",
            tags=self._tags(f"{spec.name}-out-members"),
            opts=self._opts(),
        )
        aws.vpc.SecurityGroupEgressRule(
            f"{name}-out-all",
            security_group_id=sg.id,
            cidr_ipv4="0.0.0.0/0",
            ip_protocol="-1",
            description="outbound: package mirrors, data, SSM",
            tags=self._tags(f"{spec.name}-out-all"),
            opts=self._opts(),
        )
        if spec.ssh_cidr:  # IPv4 only: validate_spec refuses an IPv6 CIDR (the VPC has no IPv6)
            aws.vpc.SecurityGroupIngressRule(
                f"{name}-in-ssh",
                security_group_id=sg.id,
                cidr_ipv4=spec.ssh_cidr,
                ip_protocol="tcp",
                from_port=22,
                to_port=22,
                description="SSH from the caller",
                tags=self._tags(f"{spec.name}-in-ssh"),
                opts=self._opts(),
            )

        # -- placement group, keys, IAM ----------------------------------------------------
        pg = aws.ec2.PlacementGroup(
            f"{name}-pg", strategy="cluster", tags=self._tags(f"{spec.name}-pg"), opts=self._opts()
        )
        user_key = catalog.option(spec, "sshPublicKey")
        if user_key:
            public_key: pulumi.Input[str] = str(user_key)
            self.ssh_private_key: pulumi.Output[Optional[str]] = pulumi.Output.secret(None)
        else:
            login = tls.PrivateKey(
                f"{name}-login-key", algorithm="ED25519", opts=pulumi.ResourceOptions(parent=self)
            )
            public_key = login.public_key_openssh
            self.ssh_private_key = pulumi.Output.secret(login.private_key_openssh)
        key_pair = aws.ec2.KeyPair(
            f"{name}-key", public_key=public_key, tags=self._tags(f"{spec.name}-key"), opts=self._opts()
        )
        s3_scopes = s3.scopes(spec)
        self.s3_policy: Optional[aws.iam.RolePolicy] = None
        profile = self._node_role(name, spec, s3_scopes) if role_reasons(spec) else None
        self._role_deps = [d for d in (self._ssm, self.s3_policy) if d is not None] if profile else []

        # -- instances ---------------------------------------------------------------------
        ami_opt = catalog.option(spec, "ami")
        self.ami_id: pulumi.Output[str] = (
            pulumi.Output.from_input(str(ami_opt))
            if ami_opt
            else aws.ec2.get_ami_output(
                most_recent=True,
                owners=list(AMI_OWNERS),
                filters=[
                    aws.ec2.GetAmiFilterArgs(name="name", values=[catalog.ami_name_pattern(spec)]),
                    aws.ec2.GetAmiFilterArgs(name="architecture", values=["x86_64"]),
                    aws.ec2.GetAmiFilterArgs(name="state", values=["available"]),
                ],
                opts=invoke_opts,
            ).id
        )
        market = None
        if spec.spot:
            market = aws.ec2.InstanceInstanceMarketOptionsArgs(
                market_type="spot",
                spot_options=aws.ec2.InstanceInstanceMarketOptionsSpotOptionsArgs(
                    spot_instance_type="one-time",
                    instance_interruption_behavior="terminate",
                ),
            )

        self.instances: list[aws.ec2.Instance] = []
        self.host_keys: list[tls.PrivateKey] = []
        public_ips: list[pulumi.Output[str]] = []
        for rank in range(spec.nodes):
            node = f"{spec.name}-node-{rank}"
            node_tags = self._tags(node, **{"gpucluster-rank": str(rank)})
            host_key = tls.PrivateKey(
                f"{name}-host-key-{rank}", algorithm="ED25519", opts=pulumi.ResourceOptions(parent=self)
            )
            self.host_keys.append(host_key)

            def user_data_of(keys: list[str], rank: int = rank) -> str:  # rank: this node's, bound now
                return render_user_data(
                    cluster=spec.name,
                    rank=rank,
                    expected_gpus=self.itype.gpus,
                    max_lifetime_minutes=spec.max_lifetime_minutes,
                    host_private_key=keys[0],
                    host_public_key=keys[1],
                    setup_torch=catalog.image_of(spec) == "base" and not ami_opt,
                    idle_minutes=catalog.idle_minutes(spec),
                )

            user_data: pulumi.Output[str] = pulumi.Output.secret(
                pulumi.Output.all(host_key.private_key_openssh, host_key.public_key_openssh).apply(user_data_of))
            network: dict[str, Any]
            if self.efa:
                # one EFA interface, made by EC2 at launch from the template, with an auto-assigned
                # public IPv4 (as SkyPilot launches EFA nodes): no Elastic IP, whose default quota
                # is 5 per region
                network = {"launch_template": aws.ec2.InstanceLaunchTemplateArgs(
                    id=self._efa_template(name, spec, subnet_id, sg).id, version="$Latest")}
            else:
                network = {
                    "subnet_id": subnet_id,
                    "vpc_security_group_ids": [sg.id],
                    "associate_public_ip_address": True,
                }
            instance = aws.ec2.Instance(
                f"{name}-node-{rank}",
                ami=self.ami_id,
                instance_type=self.itype.name,
                availability_zone=self.availability_zone,  # the subnet's; recorded, so spot is priced by zone
                placement_group=pg.name,
                key_name=key_pair.key_name,
                iam_instance_profile=profile.name if profile is not None else None,
                metadata_options=aws.ec2.InstanceMetadataOptionsArgs(
                    http_endpoint="enabled", http_tokens="required"
                ),
                root_block_device=aws.ec2.InstanceRootBlockDeviceArgs(
                    volume_type=catalog.DEFAULT_DISK_TYPE,
                    volume_size=int(spec.disk_gb),
                    encrypted=True,
                    delete_on_termination=True,
                    tags=self._tags(f"{node}-root"),
                ),
                instance_initiated_shutdown_behavior="terminate",
                instance_market_options=market,
                user_data=user_data,
                user_data_replace_on_change=True,
                tags=node_tags,
                opts=self._opts(
                    additional_secret_outputs=["user_data"],
                    depends_on=[*self._role_deps, *self._network_deps],
                ),
                **network,
            )
            public_ips.append(instance.public_ip)
            self.instances.append(instance)

        self.instance_ids = pulumi.Output.all(*[i.id for i in self.instances])
        self.private_ips = pulumi.Output.all(*[i.private_ip for i in self.instances])
        self.public_ips = pulumi.Output.all(*public_ips)
        self.host_public_keys = pulumi.Output.all(
            *[k.public_key_openssh.apply(lambda s: s.strip()) for k in self.host_keys]
        )
        self.register_outputs(self.outputs())

    # -- helpers -------------------------------------------------------------------------------
    def _node_role(self, name: str, spec: ClusterSpec,
                   s3_scopes: tuple[list[str], list[str]]) -> "aws.iam.InstanceProfile":
        """The nodes' instance role and profile, made only for a reason (`permissions.role_reasons`):
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
                policy=json.dumps(s3.policy_document(*s3_scopes, partition=s3.partition_of(self.region))),
                opts=self._opts(),
            )
        return aws.iam.InstanceProfile(
            f"{name}-profile", role=role.name, path=self._iam_path, tags=self._tags(f"{spec.name}-profile"),
            opts=self._opts()
        )

    def _tags(self, name: str, **extra: str) -> dict[str, str]:
        return {**self._base_tags, "Name": name, **extra}

    def _opts(self, **kw: Any) -> pulumi.ResourceOptions:
        return pulumi.ResourceOptions(parent=self, provider=self._provider, **kw)

    def _efa_template(self, name: str, spec: Any, subnet_id: Any, sg: Any) -> Any:
        """The launch template of the EFA nodes (made once): interface 0 is an EFA interface in the
        cluster's subnet and security group, with a public IPv4 assigned at launch (one interface
        only: EC2 assigns no public IPv4 to an instance launched with several)."""
        if getattr(self, "_efa_lt", None) is None:
            self._efa_lt = aws.ec2.LaunchTemplate(
                f"{name}-efa",
                description=f"{spec.name} EFA nodes",
                network_interfaces=[aws.ec2.LaunchTemplateNetworkInterfaceArgs(
                    device_index=0, interface_type="efa", associate_public_ip_address="true",
                    delete_on_termination="true", subnet_id=subnet_id, security_groups=[sg.id])],
                tag_specifications=[aws.ec2.LaunchTemplateTagSpecificationArgs(
                    resource_type="network-interface", tags=self._tags(f"{spec.name}-efa"))],
                tags=self._tags(f"{spec.name}-efa"),
                opts=self._opts(depends_on=[*self._network_deps]),
            )
        return self._efa_lt

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

    def outputs(self) -> dict[str, pulumi.Output[Any]]:
        """What the program exports (and the launcher reads): lists are head first."""
        return {
            "cluster_name": pulumi.Output.from_input(self.spec.name),
            "instance_ids": self.instance_ids,
            "private_ips": self.private_ips,
            "public_ips": self.public_ips,
            "ssh_user": pulumi.Output.from_input(catalog.SSH_USER),
            "ssh_private_key": self.ssh_private_key,
            "host_public_keys": self.host_public_keys,
            "region": pulumi.Output.from_input(self.region),
            "availability_zone": self.availability_zone,
            "instance_type": pulumi.Output.from_input(self.itype.name),
            "gpus_per_node": pulumi.Output.from_input(self.itype.gpus),
            "ready_file": pulumi.Output.from_input(READY_FILE),
            "node_python": pulumi.Output.from_input(catalog.NODE_PYTHON),
        }


def declare(spec: ClusterSpec) -> dict[str, pulumi.Output[Any]]:
    """Declare the cluster for a validated spec; return the outputs to export."""
    return GpuCluster(spec.name, spec=spec).outputs()
