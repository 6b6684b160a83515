"""Quotas refuse in words that name the quota and the numbers, through the API and the pages, and
none slips past under concurrent requests (threads, each on its own PostgreSQL connection)."""

import re
import threading
from datetime import UTC, datetime
from decimal import Decimal

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.urls import reverse

from billing import services as billing
from billing.models import SpendAlert, Subscription, Tier
from billing.signals import spend_threshold_reached
from desktops import services
from desktops.audit import Actor
from desktops.errors import QuotaExceeded
from desktops.models import AuditEvent, Desktop, DesktopState, Membership, Role
from tests.conftest import client_for
from tests.factories import (
    DesktopFactory,
    MembershipFactory,
    PlanFactory,
    SubscriptionFactory,
    TierFactory,
    UserFactory,
    api_key_for,
    history,
    round_prices,
)


@pytest.fixture
def owner(members):
    return members[Role.OWNER]


@pytest.fixture
def api(owner, plan):
    return client_for(key=api_key_for(owner))


def refused(response, message: str) -> None:
    assert response.status_code == 409, response.content
    error = response.json()["error"]
    assert error["code"] == "quota_exceeded" and error["message"].startswith(message), error


@pytest.mark.django_db
def test_new_workspaces_are_on_the_free_tier(user):
    workspace = services.workspace_create(user=user, name="Beta")
    assert workspace.subscription.tier.name == "free"


@pytest.mark.django_db
def test_more_free_workspaces_do_not_multiply_the_free_quotas(user):
    # Each workspace has its own quotas: a second free one would double them, a tenth multiply by ten.
    person = client_for(key=None)
    person.force_login(user)
    assert person.get("/api/workspaces").status_code == 200  # the first log-in made their own
    [own] = Membership.objects.filter(user=user, role=Role.OWNER)
    for name in ("Deux", "Trois"):
        refused(
            person.post("/api/workspaces", {"name": name}, format="json"),
            "You own 1 workspace(s) on the free",
        )
    assert Membership.objects.filter(user=user, role=Role.OWNER).count() == 1
    # Their workspace moved to a paid tier leaves room for a free one.
    Subscription.objects.filter(workspace_id=own.workspace_id).update(
        tier=TierFactory(monthly_fee=Decimal(20))
    )
    assert person.post("/api/workspaces", {"name": "Deux"}, format="json").status_code == 201


@pytest.mark.django_db
def test_a_fourth_running_desktop_on_the_free_tier_is_refused(api, workspace):
    for name in ("one", "two", "three"):
        assert api.post("/api/desktops", {"name": name}, format="json").status_code == 201
    refused(
        api.post("/api/desktops", {"name": "four"}, format="json"),
        "3 of 3 running desktops on the free tier",
    )
    stopped = DesktopFactory(workspace=workspace, state=DesktopState.STOPPED)
    refused(api.post(f"/api/desktops/{stopped.id}/start"), "3 of 3 running desktops on the free tier")
    suspended = DesktopFactory(workspace=workspace, state=DesktopState.SUSPENDED)
    refused(api.post(f"/api/desktops/{suspended.id}/resume"), "3 of 3 running desktops on the free tier")
    # Stopping one makes room (stopping ones no longer count as running).
    running = workspace.desktops.filter(name="one").get()
    Desktop.objects.filter(id=running.id).update(state=DesktopState.STOPPED)
    assert api.post(f"/api/desktops/{stopped.id}/start").status_code == 202


@pytest.mark.django_db
def test_desktop_and_disk_quotas(api, workspace, plan):
    SubscriptionFactory(workspace=workspace, tier=TierFactory(name="small", max_desktops=2, max_disk_gib=25))
    DesktopFactory(workspace=workspace, plan=plan, state=DesktopState.STOPPED)  # 10 GiB
    power = PlanFactory(name="power", disk_gib=80)
    refused(
        api.post("/api/desktops", {"name": "big", "plan": "power"}, format="json"),
        "10 of 25 GiB of disk on the small tier: a power desktop needs 80 GiB more.",
    )
    assert power.desktops.count() == 0
    assert api.post("/api/desktops", {"name": "second"}, format="json").status_code == 201
    refused(api.post("/api/desktops", {"name": "third"}, format="json"), "2 of 2 desktops on the small tier")
    # Destroyed desktops are history, not quota.
    Desktop.objects.filter(name="second").update(state=DesktopState.DESTROYED)
    assert api.post("/api/desktops", {"name": "third"}, format="json").status_code == 201


@pytest.mark.django_db
def test_a_reached_spend_cap_stops_new_starts_and_warns_once_a_month(api, workspace, plan, owner):
    round_prices(plan)
    SubscriptionFactory(
        workspace=workspace, tier=TierFactory(name="capped", monthly_spend_cap=Decimal("1.00"))
    )
    busy = DesktopFactory(workspace=workspace, plan=plan)
    DesktopFactory(workspace=workspace, plan=plan, state=DesktopState.DESTROYED)  # history, not activity
    stopped = DesktopFactory(workspace=workspace, plan=plan, state=DesktopState.STOPPED)
    history(busy, (datetime(2026, 5, 1, 0, tzinfo=UTC), DesktopState.RUNNING))
    heard = []

    def listener(sender, alert, **kwargs):
        heard.append(alert.threshold)

    spend_threshold_reached.connect(listener)
    try:
        with time_machine.travel(datetime(2026, 5, 1, 7, 30, tzinfo=UTC), tick=False) as clock:
            assert billing.spend_alerts_record() == []  # €0.75: below 80 %
            clock.move_to(datetime(2026, 5, 1, 9, tzinfo=UTC))  # €0.90
            assert [a.threshold for a in billing.spend_alerts_record()] == [80]
            assert billing.spend_alerts_record() == []  # recorded once
            assert api.post(f"/api/desktops/{stopped.id}/start").status_code == 202
            Desktop.objects.filter(id=stopped.id).update(state=DesktopState.STOPPED)
            page = client_for(owner).get(f"/w/{workspace.id}/desktops/").content.decode()
            assert "spent 80 % of its monthly cap of €1.00" in page
            clock.move_to(datetime(2026, 5, 1, 10, tzinfo=UTC))  # €1.00
            refused(
                api.post(f"/api/desktops/{stopped.id}/start"),
                "€1.00 of the €1.00 monthly spend cap on the capped tier: no desktop starts until next",
            )
            refused(api.post("/api/desktops", {"name": "more"}, format="json"), "€1.00 of the €1.00")
            assert [a.threshold for a in billing.spend_alerts_record()] == [100]
            page = client_for(owner).get(f"/w/{workspace.id}/desktops/").content.decode()
            assert "spent its monthly cap of €1.00" in page
    finally:
        spend_threshold_reached.disconnect(listener)
    assert heard == [80, 100]
    assert SpendAlert.objects.filter(workspace=workspace).count() == 2
    assert AuditEvent.objects.filter(action="billing.spend_alert", workspace_id=workspace.id).count() == 2


@pytest.mark.django_db
def test_the_page_says_why_a_new_computer_is_refused(client, workspace, members, plan):
    DesktopFactory.create_batch(3, workspace=workspace)
    client.force_login(members[Role.MEMBER].user)
    response = client.post(
        f"/w/{workspace.id}/desktops/new/",
        {"name": "x", "plan": plan.id, "image_profile": "minimal"},
        follow=True,
    )
    assert "3 of 3 running desktops on the free tier" in response.content.decode()
    assert not workspace.desktops.filter(name="x").exists()


def _at_once(count: int, work) -> list:
    """Run `work(i)` in `count` threads released together, each on its own database connection."""
    results: list = [None] * count
    gate = threading.Barrier(count)

    def run(i):
        try:
            gate.wait()
            results[i] = work(i)
        except QuotaExceeded as exc:
            results[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_creates_never_pass_the_running_quota(workspace, plan):
    owner = Actor(user=MembershipFactory(workspace=workspace, role=Role.OWNER).user)
    results = _at_once(
        20, lambda i: services.desktop_create(actor=owner, workspace=workspace, plan=plan, name=f"agent-{i}")
    )
    made = [r for r in results if isinstance(r, Desktop)]
    refusals = {str(r) for r in results if isinstance(r, QuotaExceeded)}
    assert len(made) == 3 and workspace.desktops.count() == 3
    assert refusals == {"3 of 3 running desktops on the free tier: stop or suspend one first."}


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_creates_never_pass_the_desktop_quota(workspace, plan):
    SubscriptionFactory(workspace=workspace, tier=TierFactory(name="four", max_desktops=4))
    owner = Actor(user=MembershipFactory(workspace=workspace, role=Role.OWNER).user)
    results = _at_once(
        20, lambda i: services.desktop_create(actor=owner, workspace=workspace, plan=plan, name=f"agent-{i}")
    )
    assert sum(isinstance(r, Desktop) for r in results) == 4 and workspace.desktops.count() == 4
    assert {str(r) for r in results if not isinstance(r, Desktop)} == {
        "4 of 4 desktops on the four tier: destroy one to make another."
    }


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_starts_never_pass_the_running_quota(workspace, plan):
    SubscriptionFactory(workspace=workspace, tier=TierFactory(name="five", max_running=5))
    DesktopFactory.create_batch(2, workspace=workspace, plan=plan)
    stopped = DesktopFactory.create_batch(20, workspace=workspace, plan=plan, state=DesktopState.STOPPED)
    owner = Actor(user=MembershipFactory(workspace=workspace, role=Role.OWNER).user)
    results = _at_once(20, lambda i: services.desktop_act(actor=owner, desktop=stopped[i], action="start"))
    assert sum(isinstance(r, Desktop) for r in results) == 3
    assert workspace.desktops.filter(state__in=[DesktopState.RUNNING, DesktopState.STARTING]).count() == 5
    assert {str(r) for r in results if not isinstance(r, Desktop)} == {
        "5 of 5 running desktops on the five tier: stop or suspend one first."
    }


@pytest.mark.django_db
def test_tiers_are_seeded_and_free_is_the_default(settings):
    assert settings.DEFAULT_TIER == "free"
    free = Tier.objects.get(name="free")
    assert (free.max_desktops, free.max_running, free.monthly_fee) == (5, 3, 0)
    assert free.monthly_spend_cap == free.included_usage


@pytest.mark.django_db
def test_a_free_workspace_runs_nothing_until_an_owner_confirms_an_address(plan, mailoutbox, settings):
    """Addresses cost nothing to make, and each brought a free workspace's quotas: a script signing up
    with made-up addresses had three desktops running for each."""
    settings.FREE_TIER_NEEDS_CONFIRMED_EMAIL = True  # a deployment's default (DEBUG off)
    owner = MembershipFactory(user=UserFactory(confirmed=False), role=Role.OWNER)
    workspace = owner.workspace
    # A confirmed member does not stand for the owner: a second account is as free to make.
    api = client_for(key=api_key_for(MembershipFactory(workspace=workspace, role=Role.ADMIN)))
    stopped = DesktopFactory(workspace=workspace, state=DesktopState.STOPPED)
    for response in (
        api.post("/api/desktops", {"name": "one"}, format="json"),
        api.post(f"/api/desktops/{stopped.id}/start"),
    ):
        assert response.status_code == 403, response.content
        assert response.json()["error"]["code"] == "email_unconfirmed", response.content
    assert not workspace.desktops.filter(name="one").exists()
    assert Desktop.objects.get(id=stopped.id).state == DesktopState.STOPPED
    # The owner's page says so, and sends the link again.
    browser = Client()
    browser.force_login(owner.user)
    page = browser.get(reverse("desktops", args=[workspace.id])).content.decode()
    assert "Confirm your e-mail address" in page and "Send the link again" in page
    browser.post(reverse("account_email"), {"email": owner.user.email, "action_send": ""})
    [mail] = mailoutbox
    link = re.search(r"https?://[^/\s]+(/accounts/confirm-email/\S+/)", mail.body).group(1)
    browser.post(link)
    assert api.post("/api/desktops", {"name": "one"}, format="json").status_code == 201
    assert (
        "Confirm your e-mail address"
        not in browser.get(reverse("desktops", args=[workspace.id])).content.decode()
    )


@pytest.mark.django_db
def test_a_paid_tier_does_not_wait_for_a_confirmed_address(plan, settings):
    settings.FREE_TIER_NEEDS_CONFIRMED_EMAIL = True
    owner = MembershipFactory(user=UserFactory(confirmed=False), role=Role.OWNER)
    SubscriptionFactory(workspace=owner.workspace, tier=TierFactory(monthly_fee=Decimal(20)))
    api = client_for(key=api_key_for(owner))
    assert api.post("/api/desktops", {"name": "one"}, format="json").status_code == 201
