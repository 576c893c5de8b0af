"""The cost engine reaches clouds only through the backend contract (issue 11; that no module
compares a cloud's name is checked for the whole tree by tests/test_layout.py): every cost hook
has a 'not applicable' default, and the per-cloud billing rules live in the backends."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpucluster.costing import cost as C
from gpucluster.costing.whatif import gpu_of
from gpucluster.catalog.prices import load_catalog
from gpucluster.errors import UsageError
from gpucluster.infra.contract import Capability, PricedRows
from gpucluster.infra.registry import NAMES, plugin, priced
from gpucluster.spec import ClusterSpec

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

def test_cost_hooks_have_not_applicable_defaults():
    free = plugin("local")  # machines that exist: no pricing part at all
    assert free.pricing is None and not free.can(Capability.PRICED)
    with pytest.raises(UsageError, match="not priced"):
        free.needs_pricing()
    bare = PricedRows(machine=load_catalog(False).get("aws", "us-east-1", "instance", "g5.xlarge"))
    assert bare.system_pool is None and bare.after_lifetime == "" and bare.gpu is None and bare.fee is None
    assert gpu_of(plugin("gcp"), "x", load_catalog(False)) is None
    assert priced() == ("aws", "gcp")
    assert [n for n in NAMES if plugin(n).pricing is None] == ["local", "ssh", "kubernetes"]


def test_gpus_in_the_instance_price_or_billed_apart_is_the_backends_rule():
    catalog = load_catalog(False)
    aws = C.estimate(ClusterSpec(cloud="aws", nodes=1, instance_type="g5.12xlarge"), 1, backend=plugin("aws"),
                     catalog=catalog)
    gcp = C.estimate(ClusterSpec(cloud="gcp", nodes=1, gpus_per_node=4, zone="us-central1-a"), 1,
                     backend=plugin("gcp"), catalog=catalog)
    (aws_gpus,) = [ln for ln in aws.lines if ln["category"] == "gpus"]
    assert aws_gpus["note"] == "included in the instance price" and aws_gpus["hourly"] == "0"
    assert gpu_of(plugin("aws"), "g5.12xlarge", catalog) == "A10G"
    (gcp_gpus,) = [ln for ln in gcp.lines if ln["category"] == "gpus"]
    assert Decimal(gcp_gpus["hourly"]) > 0 and "4 x V100" in gcp_gpus["description"]
    assert any("keep billing" in n for n in gcp.notes) and not any("keep billing" in n for n in aws.notes)


def test_gpus_are_billed_apart_where_the_catalog_prices_them_by_themselves():
    """Not a backend flag: a fact of the catalog (rows of kind gpu). A GCE shape without GPUs has no GPU row
    and is still billed apart (no "included" line); an EC2 type's GPUs stay in its price; a gcp machine that
    carries its GPUs names none in `what-if` (the run's accelerator says which)."""
    from gpucluster.catalog.prices import Catalog
    from gpucluster.costing.plan import gpus_billed_apart

    catalog = load_catalog(False)
    assert gpus_billed_apart(catalog, "gcp") and not gpus_billed_apart(catalog, "aws")
    assert not gpus_billed_apart(Catalog([r for r in catalog.rows.values() if r.kind != "gpu"]), "gcp")
    cpu = C.estimate(ClusterSpec(cloud="gcp", nodes=1, instance_type="n1-standard-8", gpus_per_node=0,
                                 zone="us-central1-a"), 1, backend=plugin("gcp"), catalog=catalog)
    assert not [ln for ln in cpu.lines if ln["category"] == "gpus"] and cpu.gpus == 0
    assert gpu_of(plugin("gcp"), "a3-highgpu-8g", catalog) is None and gpu_of(plugin("aws"), "p4d.24xlarge",
                                                                               catalog) == "A100"


def test_an_instance_rows_gpus_are_priced_apart_only_where_the_catalog_bills_them_so():
    """runcost: an `instance` row's `gpus` (GCE VMs) get a GPU line of their own; on aws they are in the
    instance price, so a stray `gpus` in an EC2 row's detail adds nothing."""
    from gpucluster.ledger.records import ResourceRow, RunRecord, RunRow

    def lines(cloud, region, itype):
        res = ResourceRow.from_dict({"kind": "instance", "name": "n0", "region": region, "requested_at": 0.0,
                                     "created_at": 0.0, "deleted_at": 3600.0, "confirmed_gone": True,
                                     "detail": {"instance_type": itype, "gpus": 2, "accelerator": "nvidia-tesla-v100"}})
        run = RunRecord(RunRow(id=None, cloud=cloud, prices={}), resources=[res])
        return [ln for ln in C.run_cost(run, backend=plugin(cloud), now=3600.0, catalog=load_catalog(False))["lines"]
                if ln["category"] == "gpus"]

    (gce,) = lines("gcp", "us-central1", "n1-standard-16")
    assert gce["description"] == "2 x V100 (on-demand)" and Decimal(gce["cost"]) > 0
    assert lines("aws", "us-east-1", "g5.12xlarge") == []


def test_what_a_region_needs_is_the_backends_own_warning_for_it():
    """An unpriced region's refusal adds what the backend's rules warn of there and not in its default region
    (aws: an opt-in region), nothing else: not the spec's own warnings (no instance type, no ssh CIDR)."""
    from gpucluster.costing.plan import region_needs

    assert region_needs("aws", "il-central-1", plugin("aws")) == [
        "il-central-1 is an opt-in region: enable it first with `aws account enable-region --region-name il-central-1`"]
    assert region_needs("aws", "us-east-2", plugin("aws")) == []
    assert region_needs("gcp", "asia-east1", plugin("gcp")) == []
    with pytest.raises(Exception, match="not offered in region 'xx-nowhere-1'"):
        region_needs("aws", "xx-nowhere-1", plugin("aws"))


def test_what_bills_with_the_gpu_nodes_gone_is_read_from_the_plan():
    """The fee and an always-on system pool (gcp's rows), nothing for aws; the system pool is said even when
    its machine has no price (it still runs)."""
    from gpucluster.costing.plan import kept_billing, plan

    catalog = load_catalog(False)
    gke = ClusterSpec(cloud="gcp", nodes=2, gpus_per_node=1, zone="us-central1-a")
    assert kept_billing(plan(gke, catalog, backend=plugin("gcp"))) == "the cluster fee and the system pool"
    odd = plan(gke.replace(options=(("systemMachineType", "c3-standard-4"),)), catalog, backend=plugin("gcp"))
    assert odd.system_unpriced and kept_billing(odd) == "the cluster fee and the system pool"
    ec2 = ClusterSpec(cloud="aws", nodes=2, instance_type="g5.xlarge", region="us-east-1")
    assert kept_billing(plan(ec2, catalog, backend=plugin("aws"))) == ""
    assert plan(ec2, catalog, backend=plugin("aws")).after_lifetime == ""


def test_the_nodes_disk_type_comes_with_the_price_rows_and_the_default_is_the_backends_answer():
    """No `default_disk_type` hook: `price_rows` says which disk type it prices (the spec's, else its default);
    a ledger disk that names no type is priced at what the backend gives a spec that names none; a disk type
    named and not allowed is refused before the machine is looked at (as before)."""
    from gpucluster.costing.plan import Pricer, plan
    from gpucluster.ledger.records import ResourceRow, RunRecord, RunRow

    catalog = load_catalog(False)
    assert plan(ClusterSpec(cloud="aws", nodes=1, region="us-east-1"), catalog, backend=plugin("aws")).disk.item == "gp3"
    gke = ClusterSpec(cloud="gcp", nodes=1, gpus_per_node=1, zone="us-central1-a")
    assert plan(gke, catalog, backend=plugin("gcp")).disk.item == "pd-balanced"
    assert plan(gke.replace(disk_type="pd-ssd"), catalog, backend=plugin("gcp")).disk.item == "pd-ssd"
    assert Pricer(None, "gcp", catalog, plugin("gcp")).default_disk_type == "pd-balanced"
    assert Pricer(None, "aws", catalog, plugin("aws")).default_disk_type == "gp3"
    assert Pricer(None, "nowhere", catalog, None).default_disk_type is None
    with pytest.raises(UsageError, match="gcp disk type 'foo' is not allowed"):
        plan(gke.replace(disk_type="foo", instance_type="nope-1"), catalog, backend=plugin("gcp"))
    res = ResourceRow.from_dict({"kind": "node-pool", "name": "p", "region": "us-central1", "requested_at": 0.0,
                                 "created_at": 0.0, "deleted_at": 3600.0, "confirmed_gone": True,
                                 "detail": {"machine_type": "n1-standard-16", "node_count": 1, "disk_gb": 100}})
    cost = C.run_cost(RunRecord(RunRow(id=None, cloud="gcp", prices=None), resources=[res]), backend=plugin("gcp"),
                      now=3600.0, catalog=catalog)
    assert [ln["description"] for ln in cost["lines"] if ln["category"] == "disks"] == ["100 GB pd-balanced"]


def test_a_spec_without_a_region_is_priced_where_its_run_would_go():
    """No `default_region` hook: the region a priced backend's `resolve` gives a spec that names none (aws: its
    default region; gcp: the region of its default zone), which is where the run would be created."""
    from gpucluster.costing.plan import Pricer, default_region, plan, region_for

    catalog = load_catalog(False)
    assert default_region(plugin("aws")) == "us-east-1" and default_region(plugin("gcp")) == "us-central1"
    assert plan(ClusterSpec(cloud="aws", nodes=1), catalog, backend=plugin("aws")).region == "us-east-1"
    assert plan(ClusterSpec(cloud="gcp", nodes=1, gpus_per_node=1), catalog, backend=plugin("gcp")).region == "us-central1"
    # a zone names its region; an unpriced backend (ssh) or an unknown cloud has no default
    assert region_for(ClusterSpec(cloud="aws", nodes=1, zone="us-west-2b"), plugin("aws")) == "us-west-2"
    assert region_for(ClusterSpec(cloud="ssh", nodes=1), plugin("ssh")) is None
    assert region_for(ClusterSpec(cloud="x", nodes=1), None) is None
    assert Pricer(None, "gcp", catalog, plugin("gcp")).region == "us-central1"
    assert Pricer(None, "nowhere", catalog, None).region is None
