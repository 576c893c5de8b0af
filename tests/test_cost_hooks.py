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
from gpucluster.infra.contract import Capability, Pricing
from gpucluster.infra.registry import NAMES, plugin, priced
from gpucluster.spec import ClusterSpec

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)

def test_cost_hooks_have_not_applicable_defaults():
    free = plugin("local")  # machines that exist: no pricing part at all
    assert free.pricing is None and not free.can(Capability.PRICED)
    with pytest.raises(UsageError, match="not priced"):
        free.needs_pricing()
    bare = Pricing(default_region="r", default_disk_type="d", gpus_billed_apart=False, price_rows=None,
                   instance_price=None, planned_resources=None, fetch_prices=None)
    assert bare.estimate_notes(None, Decimal(0)) == [] and gpu_of(plugin("gcp"), "x", load_catalog(False)) is None
    assert bare.system_pool(ClusterSpec(cloud="local", nodes=1)) is None
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
