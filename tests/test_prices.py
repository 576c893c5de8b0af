"""The price catalog: shipped rows, user overrides, corrupt user catalogs, refresh parsers on
responses shaped as the AWS and GCP price APIs return them (the parsers live in the backends:
infra/aws/prices.py, infra/gcp/prices.py; `refresh` reaches them through the `Pricing.fetch_prices` its
caller gives it)."""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from click.testing import CliRunner

from gpucluster.catalog import prices as P
from gpucluster.infra.aws import prices as aws_prices
from gpucluster.infra.gcp import prices as gcp_prices
from gpucluster.errors import ConfigError, UsageError
from gpucluster.infra.registry import plugin, priced

pytestmark = pytest.mark.unit  # the test tier (tests/conftest.py, docs/testing.md)


@pytest.fixture()
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUCLUSTER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_shipped_catalog_rows_are_sourced_dated_and_complete():
    cat = P.load_catalog(False)
    assert cat.warnings == []
    for row in cat.rows.values():
        # the FACTS.md snapshot of 2026-11-22; the public IPv4 charge was read on 2026-11-25; the GPU
        # families of issue 42 (g6, g6e, p4d, p4de, p5, p5e, p5en, p6-b200) on 2026-11-28
        # (and hyperdisk-balanced, the A3 Ultra boot disk, on 2026-11-28), GCP's egress (issue 43) on
        # 2026-11-28 (AWS's is FACTS.md's)
        new = (row.gpu not in (None, "A10G", "V100") or row.item.startswith(("g2-", "a2-", "a3-", "hyperdisk-"))
               or (row.kind, row.cloud) == ("egress", "gcp"))
        first = "2026-11-28" if new else "2026-11-22"
        assert row.source and row.date == ("2026-11-25" if (row.kind, row.item) == ("ipv4", "public") else first)
        assert isinstance(row.price, Decimal)
    ipv4 = cat.get("aws", "eu-west-1", "ipv4", "public")  # region "*": every region
    assert ipv4.price == Decimal("0.005") and ipv4.unit == "address-hour" and "2024-02-01" in ipv4.source
    sizes = ["g5.xlarge", "g5.2xlarge", "g5.4xlarge", "g5.8xlarge", "g5.12xlarge", "g5.16xlarge", "g5.24xlarge",
             "g5.48xlarge"]
    for region in ("us-east-1", "us-west-2", "eu-west-1"):
        for t in sizes:
            assert cat.get("aws", region, "instance", t).price > 0
    for t in sizes:
        assert cat.get("aws", "us-east-1", "instance", t, "spot").price < cat.get("aws", "us-east-1", "instance", t).price
    assert cat.get("aws", "us-east-1", "disk", "gp3").price == Decimal("0.08")
    for region in ("us-central1", "europe-west4"):
        for market in ("on-demand", "spot"):
            assert cat.get("gcp", region, "gpu", "V100", market).gpus == 1
            assert cat.get("gcp", region, "vcpu", "n1", market).price > 0
            assert cat.get("gcp", region, "memory", "n1", market).price > 0
            assert cat.get("gcp", region, "instance", "n1-standard-16", market).price > 0
    fee = cat.get("gcp", "europe-west4", "cluster-fee", "gke")  # region "*" row
    assert fee.price == Decimal("0.10") and "zonal" in fee.extra["free_tier"]
    assert {r.item for r in cat.rows.values() if r.kind == "disk" and r.cloud == "gcp"} == {
        "pd-standard", "pd-balanced", "pd-ssd", "hyperdisk-balanced"}


def test_per_gpu_hour_column():
    cat = P.load_catalog(False)
    assert cat.get("aws", "us-east-1", "instance", "g5.12xlarge").per_gpu_hour == Decimal("1.418")  # 5.672 / 4
    assert cat.get("aws", "us-east-1", "instance", "g5.48xlarge").per_gpu_hour == Decimal("2.036")  # 16.288 / 8
    assert cat.get("gcp", "us-central1", "gpu", "V100").per_gpu_hour == Decimal("2.48")
    assert cat.get("gcp", "us-central1", "instance", "n1-standard-16").per_gpu_hour is None


def test_lookup_errors_name_the_value_and_suggest():
    cat = P.load_catalog(False)
    with pytest.raises(UsageError, match='did you mean "g5.12xlarge"'):
        cat.get("aws", "us-east-1", "instance", "g5.12xlarg")
    with pytest.raises(UsageError, match='did you mean "us-west-2"'):
        cat.get("aws", "us-west-3", "instance", "g5.xlarge")
    with pytest.raises(UsageError, match="spot prices for g5.xlarge exist in: us-east-1"):
        cat.get("aws", "eu-west-1", "instance", "g5.xlarge", "spot")
    with pytest.raises(UsageError, match="gpu 'K80' is not allowed"):
        cat.select(gpu="K80")
    assert {r.gpu for r in cat.select(gpu="nvidia-tesla-t4")} == {"T4"}  # GKE's name for it (issue 42)
    assert {r.gpu for r in cat.select(gpu="v100")} == {"V100"}


def _user_doc(price="9.99"):
    return {"currency": "USD", "rows": [{
        "cloud": "aws", "region": "us-east-1", "kind": "instance", "item": "g5.xlarge", "market": "on-demand",
        "unit": "hour", "price": price, "gpus": 1, "gpu": "A10G", "source": "test", "date": "2026-12-01"}]}


def test_the_catalog_prices_exactly_the_priced_backends(home):
    """The catalog asks no registry: a row may name the clouds its shipped rows price, which are the
    priced backends (a priced backend ships its rows, docs/backends.md step 4)."""
    assert P.catalog_clouds() == P.load_catalog(False).clouds == priced() == ("aws", "gcp")
    home.mkdir(parents=True)
    doc = _user_doc()
    doc["rows"][0]["cloud"] = "local"
    (home / "prices.json").write_text(json.dumps(doc))
    cat = P.load_catalog()
    assert len(cat.warnings) == 1 and "row cloud 'local' is not one of aws, gcp" in cat.warnings[0]
    with pytest.raises(UsageError, match="cloud 'local' is not allowed; allowed: aws, gcp"):
        cat.select(cloud="local")
    with pytest.raises(UsageError, match="cloud 'ssh' is not allowed; allowed: aws, gcp"):
        P.refresh("ssh", None)


def test_user_catalog_overrides_row_by_row(home):
    home.mkdir(parents=True)
    (home / "prices.json").write_text(json.dumps(_user_doc()))
    cat = P.load_catalog()
    row = cat.get("aws", "us-east-1", "instance", "g5.xlarge")
    assert (row.price, row.date, row.origin) == (Decimal("9.99"), "2026-12-01", "user")
    # other rows still come from the shipped catalog
    assert cat.get("aws", "us-west-2", "instance", "g5.xlarge").price == Decimal("1.006")


@pytest.mark.parametrize("text", ["{not json", json.dumps({"rows": [{"cloud": "aws"}]}),
                                  json.dumps(_user_doc(price="-1")), json.dumps({"rows": "x"})])
def test_corrupt_user_catalog_is_a_warning_and_never_overwritten(home, text):
    home.mkdir(parents=True)
    path = home / "prices.json"
    path.write_text(text)
    cat = P.load_catalog()
    assert len(cat.warnings) == 1 and "not usable" in cat.warnings[0] and "shipped catalog" in cat.warnings[0]
    assert cat.get("aws", "us-east-1", "instance", "g5.xlarge").price == Decimal("1.006")
    with pytest.raises(ConfigError, match="not usable"):
        P.refresh("aws", plugin("aws").pricing, pricing_client=object(), ec2_client_for=lambda r: object())
    assert path.read_text() == text


def test_cli_prices_table_json_and_corrupt_catalog(home):
    from gpucluster.cli.cost import prices

    runner = CliRunner()
    res = runner.invoke(prices, ["--cloud", "aws", "--region", "us-east-1", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["rows"]
    g12 = next(r for r in rows if r["item"] == "g5.12xlarge" and r["market"] == "on-demand")
    assert Decimal(g12["per_gpu_hour"]) == Decimal("1.418") and g12["source"] and g12["date"]
    res = runner.invoke(prices, ["--gpu", "V100"])
    assert res.exit_code == 0 and "$/GPU-hour" in res.stdout and "2.48" in res.stdout
    res = runner.invoke(prices, ["--region", "us-eas-1"])
    assert res.exit_code == 2 and 'did you mean "us-east-1"' in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    home.mkdir(parents=True, exist_ok=True)
    (home / "prices.json").write_text("garbage")
    res = runner.invoke(prices, [])
    assert res.exit_code == 0 and "warning: user price catalog" in res.stderr
    res = runner.invoke(prices, ["refresh", "--cloud", "aws"])
    assert res.exit_code == 2 and "not usable" in res.stderr
    assert (home / "prices.json").read_text() == "garbage"


# -- AWS parsers, with botocore's Stubber ---------------------------------------------------------
def _aws_item(itype, region, usd, gpus="4", sku="SKU1"):
    return json.dumps({
        "product": {"productFamily": "Compute Instance", "sku": sku,
                    "attributes": {"instanceType": itype, "regionCode": region, "vcpu": "48", "memory": "192 GiB",
                                   "gpu": gpus, "operatingSystem": "Linux", "tenancy": "Shared",
                                   "preInstalledSw": "NA", "capacitystatus": "Used"}},
        "serviceCode": "AmazonEC2",
        "terms": {"OnDemand": {f"{sku}.JRTCKXETXF": {
            "offerTermCode": "JRTCKXETXF", "sku": sku, "effectiveDate": "2026-11-01T00:00:00Z", "termAttributes": {},
            "priceDimensions": {f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                "unit": "Hrs", "beginRange": "0", "endRange": "Inf", "appliesTo": [], "rateCode": "x",
                "description": f"${usd} per On Demand Linux {itype} Instance Hour",
                "pricePerUnit": {"USD": usd}}}}}},
        "version": "20261101000000", "publicationDate": "2026-11-01T00:00:00Z"})


def _gp3_item(region, usd):
    return json.dumps({
        "product": {"productFamily": "Storage", "sku": "GP3SKU",
                    "attributes": {"volumeApiName": "gp3", "regionCode": region, "volumeType": "General Purpose"}},
        "terms": {"OnDemand": {"GP3SKU.T": {"priceDimensions": {"GP3SKU.T.D": {
            "unit": "GB-Mo", "pricePerUnit": {"USD": usd}, "description": "gp3"}}}}}})


def test_parse_aws_price_list_and_spot_history():
    known = {r.item: r for r in P.load_catalog(False).rows.values() if r.kind == "instance" and r.cloud == "aws"}
    rows = aws_prices.parse_aws_price_list([_aws_item("g5.12xlarge", "us-east-1", "5.6720000000"),
                                   _gp3_item("us-east-1", "0.0800000000")], "2026-12-01", known)
    by = {r.kind: r for r in rows}
    inst = by["instance"]
    assert (inst.item, inst.region, inst.price, inst.gpus, inst.gpu, inst.unit) == (
        "g5.12xlarge", "us-east-1", Decimal("5.672"), 4, "A10G", "hour")
    assert inst.memory_gib == Decimal("192") and "SKU1" in inst.source and inst.date == "2026-12-01"
    assert by["disk"].item == "gp3" and by["disk"].price == Decimal("0.08") and by["disk"].unit == "gb-month"
    t0 = dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)
    hist = [
        {"AvailabilityZone": "us-east-1a", "InstanceType": "g5.xlarge", "ProductDescription": "Linux/UNIX",
         "SpotPrice": "0.4300", "Timestamp": t0},
        {"AvailabilityZone": "us-east-1a", "InstanceType": "g5.xlarge", "ProductDescription": "Linux/UNIX",
         "SpotPrice": "0.9999", "Timestamp": t0 - dt.timedelta(hours=3)},  # older: ignored
        {"AvailabilityZone": "us-east-1b", "InstanceType": "g5.xlarge", "ProductDescription": "Linux/UNIX",
         "SpotPrice": "0.4500", "Timestamp": t0},
        {"AvailabilityZone": "us-east-1b", "InstanceType": "g5.xlarge", "ProductDescription": "Windows",
         "SpotPrice": "3.0", "Timestamp": t0},
    ]
    (spot,) = aws_prices.parse_aws_spot_history(hist, "us-east-1", "2026-12-01", known)
    assert (spot.market, spot.price, spot.extra["range"], spot.gpus) == ("spot", Decimal("0.4500"),
                                                                         ["0.4300", "0.4500"], 1)
    # each zone's newest price is kept: a run is priced by the zone it ran in (issue 25)
    assert spot.extra["zones"] == {"us-east-1a": "0.4300", "us-east-1b": "0.4500"}


def _stubbed_clients(region="us-east-1"):
    boto3 = pytest.importorskip("boto3")
    from botocore.stub import ANY, Stubber

    kw = dict(aws_access_key_id="testing", aws_secret_access_key="testing")
    pricing = boto3.client("pricing", region_name="us-east-1", **kw)
    ec2 = boto3.client("ec2", region_name=region, **kw)
    ps, es = Stubber(pricing), Stubber(ec2)
    known = sorted({r.item for r in P.load_catalog(False).rows.values() if r.cloud == "aws" and r.kind == "instance"})
    for i, itype in enumerate(known):
        filters = [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in (
            ("instanceType", itype), ("regionCode", region), ("operatingSystem", "Linux"), ("tenancy", "Shared"),
            ("preInstalledSw", "NA"), ("capacitystatus", "Used"))]
        ps.add_response("get_products", {"PriceList": [_aws_item(itype, region, f"{2 + i}.5", gpus="1", sku=f"S{i}")],
                                         "FormatVersion": "aws_v1"},
                        {"ServiceCode": "AmazonEC2", "Filters": filters, "FormatVersion": "aws_v1"})
    ps.add_response("get_products", {"PriceList": [_gp3_item(region, "0.0900000000")], "FormatVersion": "aws_v1"},
                    {"ServiceCode": "AmazonEC2", "FormatVersion": "aws_v1", "Filters": ANY})
    es.add_response("describe_spot_price_history", {"SpotPriceHistory": [
        {"AvailabilityZone": f"{region}a", "InstanceType": "g5.12xlarge", "ProductDescription": "Linux/UNIX",
         "SpotPrice": "2.111100", "Timestamp": dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc)}]},
        {"InstanceTypes": known, "ProductDescriptions": ["Linux/UNIX"], "StartTime": ANY})
    return pricing, ec2, ps, es


def test_refresh_aws_with_stubbed_clients_writes_user_catalog(home):
    pricing, ec2, ps, es = _stubbed_clients()
    with ps, es:
        out = P.refresh("aws", plugin("aws").pricing, regions=["us-east-1"], pricing_client=pricing,
                        ec2_client_for=lambda r: ec2,
                        now=dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc))
        ps.assert_no_pending_responses()
        es.assert_no_pending_responses()
    known = {r.item for r in P.load_catalog(False).rows.values() if r.cloud == "aws" and r.kind == "instance"}
    assert out["rows"] == len(known) + 2 and out["date"] == "2026-12-01"  # every type, gp3, the one spot row
    cat = P.load_catalog()
    g12 = cat.get("aws", "us-east-1", "instance", "g5.12xlarge")
    assert g12.origin == "user" and g12.date == "2026-12-01" and "Price List API" in g12.source
    assert cat.get("aws", "us-east-1", "instance", "g5.12xlarge", "spot").price == Decimal("2.1111")
    assert cat.get("aws", "us-east-1", "disk", "gp3").price == Decimal("0.09")
    # regions not refreshed keep the shipped rows
    assert cat.get("aws", "us-west-2", "instance", "g5.12xlarge").origin == "shipped"


def test_refresh_without_credentials_is_a_clear_error_and_keeps_catalog(home, monkeypatch, tmp_path):
    boto3 = pytest.importorskip("boto3")
    # Something earlier in the process (another test, or gpucluster itself) used boto3's default
    # session while credentials were set: that session keeps them for the life of the process
    # (botocore's Session caches what its credential chain found). The refresh must not borrow
    # them: it failed so when the suite ran the moto tests first in the same worker.
    monkeypatch.setattr(boto3, "DEFAULT_SESSION", None)  # this test's own, restored after it
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "earlier")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "earlier")
    assert boto3.client("sts", region_name="us-east-1")._request_signer._credentials is not None
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(P.PriceRefreshError, match="could not fetch aws prices .*NoCredentialsError.*unchanged"):
        P.refresh("aws", plugin("aws").pricing, regions=["us-east-1"])
    assert not (home / "prices.json").exists()
    assert P.load_catalog().get("aws", "us-east-1", "instance", "g5.xlarge").origin == "shipped"
    with pytest.raises(UsageError, match="cloud 'azure'"):
        P.refresh("azure", None)


# -- GCP parser, with the google client's own message types --------------------------------------
def _sku(desc, regions, units, nanos, unit="h", usage="OnDemand", sku_id="AAAA-BBBB-CCCC"):
    types = pytest.importorskip("google.cloud.billing_v1.types")
    return types.Sku(
        name=f"services/6F81-5844-456A/skus/{sku_id}", sku_id=sku_id, description=desc, service_regions=regions,
        category=types.Category(service_display_name="Compute Engine", resource_family="Compute",
                                resource_group="GPU", usage_type=usage),
        pricing_info=[types.PricingInfo(pricing_expression=types.PricingExpression(
            usage_unit=unit, display_quantity=1,
            tiered_rates=[types.PricingExpression.TierRate(
                start_usage_amount=0, unit_price={"currency_code": "USD", "units": units, "nanos": nanos})]))])


def _gcp_skus():
    return [
        _sku("Nvidia Tesla V100 GPU running in Americas", ["us-central1", "us-east1"], 2, 480000000),
        _sku("Spot Preemptible Nvidia Tesla V100 GPU running in Americas", ["us-central1"], 1, 88500000,
             usage="Preemptible"),
        _sku("N1 Predefined Instance Core running in Americas", ["us-central1"], 0, 31611000),
        _sku("N1 Predefined Instance Ram running in Americas", ["us-central1"], 0, 4237000, unit="GiBy.h"),
        _sku("Balanced PD Capacity", ["us-central1"], 0, 100000000, unit="GiBy.mo"),
        _sku("Regional Balanced PD Capacity", ["us-central1"], 0, 200000000, unit="GiBy.mo"),
        _sku("Nvidia Tesla V100 GPU running in EMEA", ["europe-west4"], 2, 604000000),
        _sku("Commitment v1: Nvidia Tesla V100 GPU in Americas for 1 Year", ["us-central1"], 1, 0),
    ]


def test_parse_gcp_skus():
    rows = {r.key: r for r in gcp_prices.parse_gcp_skus(_gcp_skus(), ["us-central1"], "2026-12-01")}
    v100 = rows[("gcp", "us-central1", "gpu", "V100", "on-demand")]
    assert v100.price == Decimal("2.48") and v100.gpus == 1 and "6F81-5844-456A" in v100.source
    assert rows[("gcp", "us-central1", "gpu", "V100", "spot")].price == Decimal("1.0885")
    assert rows[("gcp", "us-central1", "disk", "pd-balanced", "on-demand")].price == Decimal("0.1")
    n16 = rows[("gcp", "us-central1", "instance", "n1-standard-16", "on-demand")]
    assert n16.price == Decimal("0.031611") * 16 + Decimal("0.004237") * 60 and n16.source.startswith("derived")
    assert not any(k[1] == "europe-west4" for k in rows)  # not asked for
    assert len([k for k in rows if k[2] == "gpu"]) == 2  # commitment SKU ignored


def test_parse_gcp_skus_for_the_gke_gpus_and_their_hosts():
    # issue 42: `prices refresh --cloud gcp` covers the GPUs and the G2/A2/A3 hosts (descriptions as the
    # Cloud Billing Catalog lists them; the prices here are made up)
    skus = [_sku("Nvidia L4 GPU running in Americas", ["us-central1"], 0, 560040000),
            _sku("Nvidia H100 80GB GPU running in Americas", ["us-central1"], 9, 796550569),
            _sku("Spot Preemptible Nvidia H100 80GB GPU running in Americas", ["us-central1"], 2, 992600000,
                 usage="Preemptible"),
            _sku("Nvidia Tesla A100 GPU running in Americas", ["us-central1"], 2, 933908000),
            _sku("Nvidia A100 80GB GPU running in Americas", ["us-central1"], 3, 928080000),
            _sku("Commitment v1: Nvidia L4 GPU running in Americas for 1 Year", ["us-central1"], 0, 100000000),
            _sku("A3 Instance Core running in Americas", ["us-central1"], 0, 30000000),
            _sku("A3 Instance Ram running in Americas", ["us-central1"], 0, 2000000, unit="GiBy.h")]
    rows = {r.key: r for r in gcp_prices.parse_gcp_skus(skus, ["us-central1"], "2026-12-01")}
    gpu = {(k[3], k[4]): r.price for k, r in rows.items() if k[2] == "gpu"}
    assert gpu == {("L4", "on-demand"): Decimal("0.56004"), ("H100", "on-demand"): Decimal("9.796550569"),
                   ("H100", "spot"): Decimal("2.9926"), ("A100", "on-demand"): Decimal("2.933908"),
                   ("A100-80GB", "on-demand"): Decimal("3.92808")}  # the commitment SKU is not a price
    host = rows[("gcp", "us-central1", "instance", "a3-highgpu-8g", "on-demand")]
    assert host.price == Decimal("0.03") * 208 + Decimal("0.002") * 1872 and host.source.startswith("derived")
    assert ("gcp", "us-central1", "instance", "a2-highgpu-1g", "on-demand") not in rows  # no A2 SKUs given


def test_refresh_gcp_with_fake_client(home):
    calls = []

    class FakeCatalogClient:
        def list_skus(self, parent):
            calls.append(parent)
            return iter(_gcp_skus())

    out = P.refresh("gcp", plugin("gcp").pricing, regions=["us-central1", "europe-west4"], client=FakeCatalogClient(),
                    now=dt.datetime(2026, 12, 1, tzinfo=dt.timezone.utc))
    assert calls == ["services/6F81-5844-456A"] and out["rows"] >= 4
    cat = P.load_catalog()
    assert cat.get("gcp", "europe-west4", "gpu", "V100").price == Decimal("2.604")
    assert cat.get("gcp", "europe-west4", "gpu", "V100").origin == "user"
    assert cat.get("gcp", "europe-west4", "gpu", "V100", "spot").origin == "shipped"
