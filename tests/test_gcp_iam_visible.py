"""Issue 41 item 9: IAM is eventually consistent, and a GKE `up` with `--data gs://`/`--output gs://`
meets it. The pods' new Google service account can be refused as a member of a bucket binding for a
while after it is made ("Service account ... does not exist", HTTP 400: GoogleCloudPlatform
magic-modules PR 14447, which made the provider wait after creating one; IAM docs, "Access change
propagation": "typically takes 2 minutes", "7 minutes or longer" at times), and the project's
Workload Identity pool appears some time after its first cluster ("Identity Pool does not exist").

The stand-in (`IamLike`): the fake Pulumi CLI runs the provider's creates in an "account" (its
`up_in_account`), on a clock the driver's own sleep advances. A service account is visible to bucket
bindings only `visible_s` after it was made; a binding made before then fails the update with
Google's own words, the account and what else was made staying in the stack, as the engine keeps
them. `up` runs again (nothing to replace: what failed was never created) until it is visible.

Checked once (2026-11-28): without the gcp relaunch hook (`Provisioner.relaunch=None`, the code
before this change), both tests below fail: the first `up` raises "Service account ... does not
exist" and what was made is destroyed. On the kinder stand-in (visible at once: `visible_s=0`) the
old code's `up` succeeds.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
pytest.importorskip("pulumi.automation")

from pulumi_fake import FakePulumiCommand  # noqa: E402

pytestmark = pytest.mark.integration  # the test tier (tests/conftest.py, docs/testing.md)

ACCOUNT = "gpucluster-iam41@my-proj.iam.gserviceaccount.com"
RESOURCES = [("gcp:container/cluster:Cluster", "iam41", "projects/my-proj/locations/us-central1-a/clusters/iam41"),
             ("gcp:serviceaccount/account:Account", "iam41-objects", ACCOUNT)]


class IamLike:
    """Google IAM's visibility of new service accounts, on a clock the driver's sleep advances."""

    def __init__(self, visible_s: float):
        self.visible_s, self.now, self.made_at = visible_s, 0.0, None
        self.bindings: list[float] = []  # when each binding was accepted

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def on_up(self, stack: str) -> None:
        if self.made_at is None:  # serviceaccount.Account: made once, kept in the stack across updates
            self.made_at = self.now
        if self.now - self.made_at < self.visible_s:  # storage.BucketIAMMember: the member must be visible
            raise RuntimeError(
                f"gcp:storage:BucketIAMMember iam41-gcs-read-0 creating failed: Error applying IAM policy for "
                f"storage bucket \"b/data-bkt\": googleapi: Error 400: Service account {ACCOUNT} does not exist., "
                "badRequest")
        self.bindings.append(self.now)


def _driver(iam: IamLike):
    from gpucluster.infra.pulumi.engine import PulumiDriver
    from gpucluster.infra.registry import plugin

    fake = FakePulumiCommand(resources=RESOURCES, outputs={"cluster_name": "iam41"}, on_up=iam.on_up,
                             up_in_account=True)
    driver = PulumiDriver(provisioner=plugin("gcp").provisioner, pulumi_command=fake, program_runner=lambda s: None)
    driver.sleep = iam.sleep
    return driver, fake


class _Said:
    def __init__(self):
        self.lines: list[str] = []

    def message(self, text):
        self.lines.append(text)

    def __getattr__(self, name):  # the resource events: not looked at here
        return lambda *a, **kw: None


def _spec():
    from gpucluster.spec import ClusterSpec

    return ClusterSpec(cloud="gcp", nodes=2, name="iam41", zone="us-central1-a", project="my-proj")


def test_a_binding_refused_while_the_new_account_is_not_visible_is_made_once_it_is(home):
    iam = IamLike(visible_s=30.0)
    driver, fake = _driver(iam)
    said = _Said()
    result = driver.up(_spec(), said)
    assert result.outputs["cluster_name"] == "iam41"
    again = [ln for ln in said.lines if "running the update again" in ln]
    assert len(again) == 3 and "service account" in again[0], said.lines  # after 5, 15 and 35 s
    assert iam.bindings == [35.0] and fake.replaced == [[]] * 4  # the same update again, nothing replaced
    assert [c for c in fake.calls if "destroy" in c] == []  # nothing was destroyed on the way


def test_an_account_that_never_shows_fails_after_120_s_naming_googles_words_and_destroys(home):
    from gpucluster.errors import ProvisionError
    from gpucluster.infra.gcp import engine

    iam = IamLike(visible_s=10_000.0)
    driver, fake = _driver(iam)
    said = _Said()
    with pytest.raises(ProvisionError, match=r"does not exist.*has been destroyed"):
        driver.up(_spec(), said)
    assert iam.now == sum(engine.RELAUNCH_DELAYS) == 120.0
    assert len([ln for ln in said.lines if "running the update again" in ln]) == len(engine.RELAUNCH_DELAYS)
    assert fake.stacks == {}


def test_only_these_two_messages_are_retried():
    from gpucluster.infra.gcp.engine import relaunch

    assert relaunch(None, "googleapi: Error 400: Identity Pool does not exist (my-proj.svc.id.goog).")[0] is None
    assert relaunch(None, "Error 403: Permission 'storage.buckets.setIamPolicy' denied") is None
    assert relaunch(None, "ZONE_RESOURCE_POOL_EXHAUSTED") is None
