"""Stacks that update and launches that wait for IAM (issue 40 items 2 and 3), on the EC2 that keeps time.

The account (tests/aws_account.py) is moto's behind the timed EC2 (tests/ec2_timed.py), on a clock
scaled 100:1; the REAL provider and driver run the REAL aws program's declarations through the FAKE
Pulumi CLI, whose `up` of a stack that holds resources is an update as the engine and pulumi-aws make
it (tests/aws_apply.py `apply` with the stack's state).

- Item 2: an update that changes the nodes' launch template (new tags from a new run id; a new
  DLAMI) made the provider modify the instant fleet in place; EC2 refuses ModifyFleet for an instant
  fleet (FleetNotInModifiableState: API reference, ModifyFleet, "only supported for the maintain
  type"). The program now replaces the template and the fleet (replaceOnChanges, the old fleet deleted
  first).
- Item 3: a fleet launched within seconds of CreateInstanceProfile launches nothing and lists
  "Invalid IAM Instance Profile name" (IAM's eventual consistency: AWS IAM User Guide, "Troubleshooting
  IAM roles"; terraform-provider-aws retries RunInstances on it for 2 minutes). `up` launches the
  fleet again (`pulumi up --replace` of the fleet alone) with backoff, keeping the profile.

Checked once (2026-11-28) by reverting the fixes: on this stand-in the old program fails the second
`up` with FleetNotInModifiableState ("updating the existing cluster ... failed"), and the old driver
fails the first `up` of a cluster with an instance role with "Invalid IAM Instance Profile name".
On the old, kinder stand-in (a new profile usable at once) the old driver's `up` succeeds; moto
alone has no ModifyFleet ("The modify_fleet action has not been implemented"), so the old program's
update failed there too, for that reason, and no test had tried one.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
pytest.importorskip("moto")
pytest.importorskip("pulumi.automation")
pytest.importorskip("pulumi_aws")

import aws_apply  # noqa: E402
from aws_account import REGION, _Quiet, _spec, accounts  # noqa: E402

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)


@pytest.fixture
def account(home, monkeypatch):
    # 100 simulated seconds per real second: a node terminates in about a second; a new instance
    # profile is unusable to EC2 for 30 s after it is made
    yield from accounts(monkeypatch, 100.0, profile_s=30.0)


class _Lines(_Quiet):
    def __init__(self):
        self.lines: list[str] = []

    def message(self, text):
        self.lines.append(text)


def _instances(account) -> dict[str, str]:
    ec2 = account.session.client("ec2", region_name=REGION)
    return {i["InstanceId"]: i["State"]["Name"] for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]}


def test_an_update_with_new_tags_replaces_the_fleet_and_its_template(account):
    """Item 2: `up` of a kept cluster again (a new run id: new tags in the template's instance tags)
    replaces the template and the fleet, the old fleet's nodes terminated, instead of ModifyFleet of an
    instant fleet (old code: "updating the existing cluster ... FleetNotInModifiableState")."""
    provider = account.provider()
    first = provider.up(_spec("upd40"), _Quiet())
    old = dict(account.states["upd40"])
    second = provider.up(_spec("upd40"), _Quiet())  # same name, a new run id
    new = account.states["upd40"]
    assert not [r for r in account.timed.refused if r[0] == "ModifyFleet"]
    assert new["upd40-fleet"]["id"] != old["upd40-fleet"]["id"]
    assert new["upd40-nodes"]["id"] != old["upd40-nodes"]["id"]  # a new template, not a new version
    assert new["upd40-vpc"]["id"] == old["upd40-vpc"]["id"]  # the network is kept (its tags updated in place)
    states = _instances(account)
    assert {states[i] for i in old["upd40-fleet"]["members"]} <= {"shutting-down", "terminated"}
    assert len(second.nodes) == 2 and {n.host for n in second.nodes}.isdisjoint({n.host for n in first.nodes})
    # the replaced fleet and template are deleted; the stack holds the new ones only
    assert aws_apply.exists([("fleet", old["upd40-fleet"]["id"]), ("launch-template", old["upd40-nodes"]["id"])],
                            account.session) == []
    assert ("fleet", old["upd40-fleet"]["id"]) not in account.made["upd40"]


def test_the_program_replaces_template_and_fleet_on_a_new_ami_and_deletes_the_old_fleet_first(home):
    """Item 2, the program's options: a new DLAMI (most_recent) or new tags change the template, which
    is replaced, and the fleet with it, deleted before its replacement launches (unit: the recorded
    registration options)."""
    from gpucluster.infra.aws import mock_runtime

    built = mock_runtime.build(_spec("opt40"))
    options = built.recorder.options
    template, fleet = options["opt40-nodes"], options["opt40-fleet"]
    assert {"imageId", "tagSpecifications", "userData", "iamInstanceProfile"} <= set(template["replaceOnChanges"])
    assert "launchTemplateConfigs" in fleet["replaceOnChanges"] and fleet["deleteBeforeReplace"] is True
    assert "tags" not in fleet["replaceOnChanges"]  # the fleet's own tags: CreateTags, in place


def test_a_fleet_refused_for_a_new_instance_profile_is_launched_again(account):
    """Item 3: with an instance role (option ssm=true) the first launches come within seconds of
    CreateInstanceProfile and EC2 refuses them; `up` launches the fleet again with backoff, the same
    profile kept, and the cluster comes up (old code: "... Invalid IAM Instance Profile name")."""
    provider = account.provider()
    lines = _Lines()
    cluster = provider.up(_spec("iam40", options=(("ssm", "true"),)), lines)
    assert len(cluster.nodes) == 2 and all(n.host for n in cluster.nodes)
    again = [ln for ln in lines.lines if "launching it again" in ln]
    assert again and "instance profile" in again[0], lines.lines
    # only the fleet was launched again: one profile, one template, and the refused fleets replaced
    assert len(account.timed.profiles) == 1
    assert account.fake.replaced[0] == [] and all(
        urns and all("aws:ec2/fleet:Fleet" in u for u in urns) for urns in account.fake.replaced[1:])
    assert len(account.fake.replaced) == len(again) + 1
    refused = [f for f, errs in account.timed.fleet_errors.items() if errs]
    assert len(refused) == len(again)
    assert not [f for f in refused if aws_apply.exists([("fleet", f)], account.session)]  # replaced: deleted


def test_a_profile_that_never_propagates_fails_after_the_backoff_naming_it(account):
    """The relaunches are bounded (120 s, terraform's iamPropagationTimeout); then `up` fails with EC2's
    own words and what was made is destroyed."""
    from gpucluster.errors import ProvisionError
    from gpucluster.infra.aws import engine

    account.timed.profile_s = 10_000.0
    driver = account.provider().driver
    lines = _Lines()
    with pytest.raises(ProvisionError, match="Invalid IAM Instance Profile name.*what was created has been destroyed"):
        driver.up(_spec("iam41", options=(("ssm", "true"),)), lines)
    assert len([ln for ln in lines.lines if "launching it again" in ln]) == len(engine.RELAUNCH_DELAYS)
    assert sum(engine.RELAUNCH_DELAYS) == 120.0
    assert account.made["iam41"] == [] and account.states["iam41"] == {}
