"""What `pulumi up` of the REAL aws program would make in an AWS account, made in moto's account
(a stand-in for the AWS provider applying a plan; test-only).

`apply(recorder, session)` takes what the program declared under Pulumi's mock runtime
(`infra.aws.mock_runtime.build`) and creates each resource in the account through boto3, with the
inputs the program gave it: the tags (Name, managed-by, gpucluster-cluster/-run and the owner
marks), the IAM path of the role and instance profile, the nodes' launch template (its instance,
volume and interface tags) and the instant EC2 Fleet that launches them all (its instances are
listed after it, as the fleet reports them). References between resources (the mock runtime's
ids, "<resource name>-id") become the real ids. It returns what it made, in creation order, so
that `destroy(made, session)` deletes exactly those, the way `pulumi destroy` deletes what its
state holds (never by tag). Resources that carry no AWS object of their own (rules, associations,
the provider, TLS keys) are skipped: they hold no tag and bill nothing; so is the placement group,
which moto 5.2 cannot create (CreatePlacementGroup "has not been implemented").
"""

from __future__ import annotations

import itertools
from typing import Any

_seq = itertools.count(1)


def _tags(inputs: dict[str, Any]) -> list[dict[str, str]]:
    return [{"Key": k, "Value": str(v)} for k, v in (inputs.get("tags") or {}).items()]


def _spec(kind: str, inputs: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"ResourceType": kind, "Tags": _tags(inputs)}]


def apply(recorder: Any, session: Any, region: str = "us-east-1") -> list[tuple[str, str]]:
    """Create in the account what the recorded program declared; [(kind, id)] in creation order."""
    ec2, iam = session.client("ec2", region_name=region), session.client("iam")
    ids: dict[str, str] = {}  # mock id ("<name>-id") -> the account's id
    made: list[tuple[str, str]] = []

    def ref(value: Any) -> Any:
        return ids.get(value, value)

    for r in recorder.resources:
        i, typ, n = r.inputs, r.typ, next(_seq)
        if typ == "aws:ec2/vpc:Vpc":
            rid = ec2.create_vpc(CidrBlock=i["cidrBlock"], TagSpecifications=_spec("vpc", i))["Vpc"]["VpcId"]
            made.append(("vpc", rid))
        elif typ == "aws:ec2/internetGateway:InternetGateway":
            rid = ec2.create_internet_gateway(TagSpecifications=_spec("internet-gateway", i))["InternetGateway"][
                "InternetGatewayId"]
            ec2.attach_internet_gateway(InternetGatewayId=rid, VpcId=ref(i["vpcId"]))
            made.append(("internet-gateway", rid))
        elif typ == "aws:ec2/subnet:Subnet":
            rid = ec2.create_subnet(VpcId=ref(i["vpcId"]), CidrBlock=i["cidrBlock"],
                                    AvailabilityZone=i.get("availabilityZone") or f"{region}a",
                                    TagSpecifications=_spec("subnet", i))["Subnet"]["SubnetId"]
            made.append(("subnet", rid))
        elif typ == "aws:ec2/routeTable:RouteTable":
            rid = ec2.create_route_table(VpcId=ref(i["vpcId"]), TagSpecifications=_spec("route-table", i))[
                "RouteTable"]["RouteTableId"]
            made.append(("route-table", rid))
        elif typ == "aws:ec2/securityGroup:SecurityGroup":
            rid = ec2.create_security_group(GroupName=f"{r.name}-{n}", Description=i.get("description") or "sg",
                                            VpcId=ref(i["vpcId"]), TagSpecifications=_spec("security-group", i))[
                "GroupId"]
            made.append(("security-group", rid))
        elif typ == "aws:ec2/keyPair:KeyPair":
            rid = f"{r.name}-{n}"
            ec2.create_key_pair(KeyName=rid, TagSpecifications=_spec("key-pair", i))
            made.append(("key-pair", rid))
        elif typ == "aws:iam/role:Role":
            rid = f"{r.name}-{n}"  # Pulumi auto-names roles: name + random suffix
            iam.create_role(RoleName=rid, Path=i.get("path", "/"), AssumeRolePolicyDocument=i["assumeRolePolicy"],
                            Tags=_tags(i))
            made.append(("iam-role", rid))
        elif typ == "aws:iam/instanceProfile:InstanceProfile":
            rid = f"{r.name}-{n}"
            iam.create_instance_profile(InstanceProfileName=rid, Path=i.get("path", "/"), Tags=_tags(i))
            iam.add_role_to_instance_profile(InstanceProfileName=rid, RoleName=ref(i["role"]))
            made.append(("instance-profile", rid))
        elif typ == "aws:ec2/launchTemplate:LaunchTemplate":
            # the nodes' template: its instance/volume/interface tags are what the fleet's instances get
            nic = dict((i.get("networkInterfaces") or [{}])[0])
            data: dict[str, Any] = {"ImageId": "ami-12c6146b", "TagSpecifications": [
                {"ResourceType": t["resourceType"], "Tags": _tags(t)} for t in i.get("tagSpecifications") or []]}
            if nic:
                data["NetworkInterfaces"] = [{"DeviceIndex": 0, "SubnetId": ref(nic.get("subnetId")),
                                              "Groups": [ref(g) for g in nic.get("securityGroups") or []],
                                              "AssociatePublicIpAddress": nic.get("associatePublicIpAddress") == "true"}]
            rid = ec2.create_launch_template(LaunchTemplateName=f"{r.name}-{n}", LaunchTemplateData=data,
                                             TagSpecifications=_spec("launch-template", i))[
                "LaunchTemplate"]["LaunchTemplateId"]
            made.append(("launch-template", rid))
        elif typ == "aws:ec2/fleet:Fleet":
            # one instant fleet for all nodes (CreateFleet: all or none with MinTargetCapacity)
            config = (i.get("launchTemplateConfigs") or [{}])[0]
            target = i.get("targetCapacitySpecification") or {}
            options = i.get("onDemandOptions") or i.get("spotOptions") or {}
            opts_key = "OnDemandOptions" if i.get("onDemandOptions") else "SpotOptions"
            resp = ec2.create_fleet(
                Type=i.get("type", "instant"), TagSpecifications=_spec("fleet", i),
                LaunchTemplateConfigs=[{
                    "LaunchTemplateSpecification": {"LaunchTemplateId": ref(config["launchTemplateSpecification"][
                        "launchTemplateId"]), "Version": "$Latest"},
                    "Overrides": [{"InstanceType": o.get("instanceType")} for o in config.get("overrides") or []]}],
                TargetCapacitySpecification={"TotalTargetCapacity": int(target["totalTargetCapacity"]),
                                             "DefaultTargetCapacityType": target["defaultTargetCapacityType"]},
                **{opts_key: {"MinTargetCapacity": int(options.get("minTargetCapacity") or 0),
                              "SingleInstanceType": bool(options.get("singleInstanceType")),
                              "SingleAvailabilityZone": bool(options.get("singleAvailabilityZone"))}})
            rid = resp["FleetId"]
            made.append(("fleet", rid))
            made.extend(("instance", iid) for s in resp.get("Instances") or [] for iid in s.get("InstanceIds") or [])
        elif typ == "aws:ec2/instance:Instance":
            root = i.get("rootBlockDevice") or {}
            specs = [{"ResourceType": "instance", "Tags": _tags(i)}]
            if root.get("tags"):
                specs.append({"ResourceType": "volume", "Tags": _tags(root)})
            inst = ec2.run_instances(ImageId="ami-12c6146b", MinCount=1, MaxCount=1, InstanceType=i["instanceType"],
                                     SubnetId=ref(i["subnetId"]),
                                     SecurityGroupIds=[ref(x) for x in i.get("vpcSecurityGroupIds") or []],
                                     TagSpecifications=specs)["Instances"][0]
            rid = inst["InstanceId"]
            made.append(("instance", rid))
        else:
            continue
        ids[f"{r.name}-id"] = rid
        if typ == "aws:iam/role:Role":
            ids[r.name] = rid  # the profile refers to the role by name
    return made


def destroy(made: list[tuple[str, str]], session: Any, region: str = "us-east-1") -> None:
    """Delete exactly what `apply` made (as `pulumi destroy` deletes what its state holds)."""
    from gpucluster.domain import Leftover
    from gpucluster.infra.aws.leftovers import delete

    errors = delete([Leftover(kind, rid, None if kind in ("iam-role", "instance-profile") else region)
                     for kind, rid in made], session=session, wait_seconds=30)
    assert errors == [], errors


def exists(made: list[tuple[str, str]], session: Any, region: str = "us-east-1") -> list[tuple[str, str]]:
    """Which of `made` the account still has (instances: not terminated)."""
    ec2, iam = session.client("ec2", region_name=region), session.client("iam")
    live = []
    for kind, rid in made:
        if kind == "instance":
            state = ec2.describe_instances(InstanceIds=[rid])["Reservations"][0]["Instances"][0]["State"]["Name"]
            ok = state not in ("terminated", "shutting-down")
        elif kind == "vpc":
            ok = bool(ec2.describe_vpcs(Filters=[{"Name": "vpc-id", "Values": [rid]}])["Vpcs"])
        elif kind == "security-group":
            ok = bool(ec2.describe_security_groups(Filters=[{"Name": "group-id", "Values": [rid]}])["SecurityGroups"])
        elif kind == "subnet":
            ok = bool(ec2.describe_subnets(Filters=[{"Name": "subnet-id", "Values": [rid]}])["Subnets"])
        elif kind == "internet-gateway":
            ok = bool(ec2.describe_internet_gateways(Filters=[{"Name": "internet-gateway-id", "Values": [rid]}])[
                "InternetGateways"])
        elif kind == "route-table":
            ok = bool(ec2.describe_route_tables(Filters=[{"Name": "route-table-id", "Values": [rid]}])["RouteTables"])
        elif kind == "fleet":
            ok = any(not str(f.get("FleetState", "")).startswith("deleted")
                     for f in ec2.describe_fleets(FleetIds=[rid]).get("Fleets", []))
        elif kind == "launch-template":
            ok = rid in {t["LaunchTemplateId"] for t in ec2.describe_launch_templates()["LaunchTemplates"]}
        elif kind == "key-pair":
            ok = rid in {k["KeyName"] for k in ec2.describe_key_pairs()["KeyPairs"]}
        elif kind == "iam-role":
            ok = rid in {r["RoleName"] for p in iam.get_paginator("list_roles").paginate() for r in p["Roles"]}
        elif kind == "instance-profile":
            ok = rid in {r["InstanceProfileName"] for p in iam.get_paginator("list_instance_profiles").paginate()
                         for r in p["InstanceProfiles"]}
        else:
            raise AssertionError(f"exists() does not know {kind}")
        if ok:
            live.append((kind, rid))
    return live
