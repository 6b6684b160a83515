"""The costs in the REST API and Mission Control, the CSV export, the pricing page, and support's
changes of tier and credits in the admin."""

import csv
import io
import time
from datetime import UTC, datetime
from decimal import Decimal

import pytest
import time_machine

from billing import selectors as billing_selectors
from billing import services as billing
from billing.models import CreditGrant, ModelPrice, StorageDay, Subscription, Tier
from billing.selectors import tier_of
from desktops.audit import Actor
from desktops.errors import Forbidden
from desktops.models import AuditEvent, ChatMessage, DesktopState, LLMKey, Role
from tests.conftest import client_for
from tests.factories import DesktopFactory, UserFactory, api_key_for, history, round_prices

pytestmark = pytest.mark.django_db

NOW = datetime(2026, 7, 3, 12, tzinfo=UTC)


def at(day, hour):
    return datetime(2026, 7, day, hour, tzinfo=UTC)


@pytest.fixture
def fleet(workspace, plan):
    """Two desktops with a known July: `alpha` ran 10 h and held 5 GiB a day; `beta` ran 2 h and answered."""
    round_prices(plan)
    alpha = DesktopFactory(workspace=workspace, plan=plan, name="alpha")
    history(alpha, (at(1, 0), DesktopState.RUNNING), (at(1, 10), DesktopState.STOPPED))
    StorageDay.objects.create(desktop=alpha, day=at(1, 0).date(), gib_hours=Decimal(120))
    beta = DesktopFactory(workspace=workspace, plan=plan, name="beta")
    history(beta, (at(2, 8), DesktopState.RUNNING), (at(2, 10), DesktopState.SUSPENDED))
    LLMKey.objects.create(workspace=workspace, provider="openai", name="k", last4="0000")  # gpt-5 by default
    ModelPrice.objects.create(
        workspace=workspace, model="gpt-5", input_per_million=Decimal(1), output_per_million=Decimal(10)
    )
    ChatMessage.objects.create(
        desktop=beta,
        author=ChatMessage.Author.AGENT,
        completed_at=at(2, 9),
        input_tokens=500_000,
        output_tokens=100_000,
    )
    return alpha, beta


def test_workspace_costs_in_the_api(members, workspace, fleet):
    api = client_for(key=api_key_for(members[Role.VIEWER], scope="read"))
    with time_machine.travel(NOW, tick=False):
        body = api.get(f"/api/workspaces/{workspace.id}/costs?month=2026-07").json()
    assert (body["month"], body["currency"], body["tier"]["name"]) == ("2026-07", "EUR", "free")
    assert body["usage"]["runningHours"] == "12.0000" and body["usage"]["gibHours"] == "120.0000"
    assert body["cost"] == {"compute": "1.20", "storage": "0.12", "models": "1.50", "total": "2.82"}
    assert (body["agentModel"], body["modelPriced"]) == ("gpt-5", True)
    # Free tier: the €1.32 of desktops is within what it includes.
    assert (body["fee"], body["included"], body["owed"], body["spendCap"]) == (
        "0.00",
        "1.32",
        "0.00",
        "15.00",
    )
    assert body["capUsedPercent"] == 18
    assert [d["day"] for d in body["days"]] == ["2026-07-01", "2026-07-02", "2026-07-03"]
    assert [d["runningDesktops"] for d in body["days"]] == [1, 1, 0]
    assert [d["cost"]["total"] for d in body["days"]] == ["1.12", "1.70", "0.00"]
    assert [(d["name"], d["cost"]["total"]) for d in body["desktops"]] == [
        ("beta", "1.70"),
        ("alpha", "1.12"),
    ]
    assert body["desktops"][0]["usage"]["suspendedHours"] == "26.0000"  # 2 July 10:00 to now
    empty = api.get(f"/api/workspaces/{workspace.id}/costs?month=2026-01").json()
    assert empty["desktops"] == [] and empty["cost"]["total"] == "0.00"
    bad = api.get(f"/api/workspaces/{workspace.id}/costs?month=2026-13")
    assert bad.status_code == 400 and "month" in bad.json()["error"]["fields"]


def test_desktop_costs_in_the_api(members, workspace, fleet):
    alpha, _ = fleet
    api = client_for(key=api_key_for(members[Role.VIEWER]))
    with time_machine.travel(NOW, tick=False):
        body = api.get(f"/api/desktops/{alpha.id}/costs?month=2026-07").json()
    assert (body["desktopId"], body["name"], body["plan"]) == (alpha.id, "alpha", "starter")
    assert body["cost"]["total"] == "1.12" and body["usage"]["stoppedHours"] == "50.0000"
    assert [(d["day"], d["cost"]["compute"]) for d in body["days"]] == [
        ("2026-07-01", "1.00"),
        ("2026-07-02", "0.00"),
        ("2026-07-03", "0.00"),
    ]


def test_quota_and_tiers_in_the_api(members, workspace, fleet):
    api = client_for(key=api_key_for(members[Role.MEMBER]))
    with time_machine.travel(NOW, tick=False):
        quota = api.get(f"/api/workspaces/{workspace.id}/quota").json()
    assert quota["tier"]["name"] == "free"
    assert quota["desktops"] == {"used": 2, "limit": 5, "percent": 40}
    assert quota["running"] == {"used": 0, "limit": 3, "percent": 0}
    assert quota["diskGib"] == {"used": 20, "limit": 50, "percent": 40}
    assert quota["spend"] == {"used": "2.82", "limit": "15.00", "percent": 18}
    tiers = api.get("/api/tiers").json()["results"]
    assert [t["name"] for t in tiers] == ["free", "team", "business"]
    plans = api.get("/api/plans").json()["results"]
    assert (plans[0]["hourlyPrice"], plans[0]["storagePrice"]) == ("0.1000", "0.7300")


def test_model_prices_through_the_api(members, workspace):
    admin = client_for(key=api_key_for(members[Role.ADMIN]))
    url = f"/api/workspaces/{workspace.id}/model-prices"
    body = {"model": "claude-sonnet-4-5", "inputPerMillion": "3", "outputPerMillion": "15"}
    created = admin.post(url, body, format="json")
    assert created.status_code == 200 and created.json()["inputPerMillion"] == "3.0000"
    admin.post(url, {**body, "outputPerMillion": "14.5"}, format="json")  # changed, not doubled
    listed = admin.get(url).json()["results"]
    assert [(p["model"], p["outputPerMillion"]) for p in listed] == [("claude-sonnet-4-5", "14.5000")]
    negative = admin.post(url, {**body, "inputPerMillion": "-1"}, format="json")
    assert negative.status_code == 400
    assert admin.delete(f"{url}/{listed[0]['id']}").status_code == 204
    assert admin.delete(f"{url}/{listed[0]['id']}").status_code == 404
    assert AuditEvent.objects.filter(action="billing.model_price", workspace_id=workspace.id).count() == 2


def test_outsiders_cannot_read_another_workspaces_costs(client, members, workspace, fleet):
    """An attacker with a valid key (and a session) of their own workspace, guessing ids of this one."""
    alpha, _ = fleet
    outsider = members["outsider"]
    api = client_for(key=api_key_for(outsider))
    for url in (
        f"/api/workspaces/{workspace.id}/costs",
        f"/api/workspaces/{workspace.id}/costs?month=2026-07",
        f"/api/workspaces/{workspace.id}/quota",
        f"/api/workspaces/{workspace.id}/model-prices",
        f"/api/desktops/{alpha.id}/costs",
    ):
        response = api.get(url)
        assert response.status_code == 404, url
        assert "alpha" not in response.content.decode() and "gpt-5" not in response.content.decode()
    # Their own workspace's key cannot be pointed at this one either, nor a session at its pages.
    own = outsider.workspace_id
    assert api.get(f"/api/workspaces/{own}/costs").status_code == 200
    assert (
        api.post(
            f"/api/workspaces/{workspace.id}/model-prices",
            {"model": "gpt-5", "inputPerMillion": "0", "outputPerMillion": "0"},
            format="json",
        ).status_code
        == 404
    )
    client.force_login(outsider.user)
    assert client.get(f"/w/{workspace.id}/costs/").status_code == 404
    assert client.get(f"/w/{workspace.id}/costs/?format=csv").status_code == 404
    assert ModelPrice.objects.get(workspace=workspace).output_per_million == 10


def test_costs_page_shows_totals_charts_and_top_spenders(client, members, workspace, fleet):
    client.force_login(members[Role.VIEWER].user)
    with time_machine.travel(NOW, tick=False):
        page = client.get(f"/w/{workspace.id}/costs/?month=2026-07").content.decode()
    assert "Costs of July 2026" in page
    assert "€2.82" in page and "€1.20" in page and "€0.12" in page and "€1.50" in page
    assert page.count('<g class="bar">') == 6  # three days, two charts
    assert page.index("beta") < page.index("alpha")  # the top spender first
    assert "Tokens are priced at gpt-5" in page


def test_csv_export_rows_add_up_and_cells_cannot_run_as_formulas(client, members, workspace, fleet, plan):
    plan.name = "=HYPERLINK(1)"  # a name support could give a plan, read by a spreadsheet
    plan.save()
    client.force_login(members[Role.VIEWER].user)
    with time_machine.travel(NOW, tick=False):
        response = client.get(f"/w/{workspace.id}/costs/?month=2026-07&format=csv")
    assert response["Content-Type"] == "text/csv"
    assert f"costs-{workspace.id}-2026-07.csv" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert sum(Decimal(r["total_eur"]) for r in rows) == Decimal("2.82")
    assert {r["plan"] for r in rows} == {"'=HYPERLINK(1)"}
    first = next(r for r in rows if r["desktop"] == "alpha" and r["day"] == "2026-07-01")
    assert (first["running_hours"], first["gib_hours"], first["compute_eur"]) == (
        "10.0000",
        "120.0000",
        "1.0000",
    )


def test_pricing_page_is_public_matches_the_tiers_and_is_linked_from_sign_up(client, plan):
    round_prices(plan)
    page = client.get("/pricing/").content.decode()
    for tier in Tier.objects.filter(is_public=True):
        assert f'id="tier-{tier.name}"' in page
    assert "5 desktops" in page and "3 running at once" in page and "Spending capped at €15.00" in page
    assert "€29.00 a month" in page and "€73.00" in page  # starter always on: 730 h at €0.10
    assert "/pricing/" in client.get("/accounts/signup/").content.decode()


@pytest.fixture
def staff_client(client, db):
    client.force_login(UserFactory(is_staff=True, is_superuser=True, email="support@example.com"))
    return client


def test_support_changes_a_tier_and_grants_credits_in_the_admin_audited(staff_client, workspace):
    team = Tier.objects.get(name="team")
    response = staff_client.post(
        "/admin/billing/subscription/add/", {"workspace": workspace.id, "tier": team.id}, follow=True
    )
    assert response.status_code == 200
    assert Subscription.objects.get(workspace=workspace).tier == team
    tier_change = AuditEvent.objects.get(action="billing.tier", workspace_id=workspace.id)
    assert tier_change.actor == "support:support@example.com"
    assert tier_change.detail == {"previous": "free", "tier": "team"}
    business = Tier.objects.get(name="business")
    staff_client.post(f"/admin/billing/subscription/{workspace.id}/change/", {"tier": business.id})
    assert Subscription.objects.get(workspace=workspace).tier == business

    response = staff_client.post(
        "/admin/billing/creditgrant/add/",
        {"workspace": workspace.id, "amount": "25.00", "reason": "beta feedback"},
        follow=True,
    )
    assert response.status_code == 200
    grant = CreditGrant.objects.get(workspace=workspace)
    assert (grant.amount, grant.granted_by) == (Decimal(25), "support:support@example.com")
    audit = AuditEvent.objects.get(action="billing.credit", workspace_id=workspace.id)
    assert audit.target == grant.id and audit.detail["amount"] == "25.00"
    assert staff_client.post(f"/admin/billing/creditgrant/{grant.id}/delete/").status_code == 403
    for page in ("tier", "planprice", "subscription", "creditgrant", "spendalert"):
        assert staff_client.get(f"/admin/billing/{page}/").status_code == 200


def test_only_support_changes_tiers(members, workspace):
    owner = Actor(user=members[Role.OWNER].user)
    with pytest.raises(Forbidden):
        billing.subscription_set(
            actor=owner, workspace_id=workspace.id, tier=Tier.objects.get(name="business")
        )
    with pytest.raises(Forbidden):
        billing.credit_grant(actor=owner, workspace_id=workspace.id, amount=Decimal(1), reason="me")
    assert not CreditGrant.objects.exists() and tier_of(workspace).name == "free"


def test_model_prices_on_the_settings_page_are_for_admins_to_set(client, members, workspace):
    LLMKey.objects.create(workspace=workspace, provider="anthropic", name="k", last4="0000")
    url = f"/w/{workspace.id}/model-prices/new/"
    body = {"model": "claude-sonnet-4-5", "input_per_million": "3", "output_per_million": "15"}
    client.force_login(members[Role.VIEWER].user)
    assert "This needs the admin role" in client.post(url, body, follow=True).content.decode()
    assert not ModelPrice.objects.exists()
    client.force_login(members[Role.ADMIN].user)
    page = client.post(url, body, follow=True).content.decode()
    assert "Model price saved." in page and "claude-sonnet-4-5" in page
    assert "Your agents' first choice now: claude-sonnet-4-5" in page  # the key's provider default
    price = ModelPrice.objects.get(workspace=workspace)
    client.post(f"/w/{workspace.id}/model-prices/{price.id}/delete/")
    assert not ModelPrice.objects.exists()


def test_the_desktop_page_shows_its_month(client, members, workspace, fleet):
    alpha, _ = fleet
    client.force_login(members[Role.VIEWER].user)
    with time_machine.travel(NOW, tick=False):
        page = client.get(f"/desktops/{alpha.id}/").content.decode()
    assert "€1.12: 10.00 h running, 120.0 GiB-hours of disk" in page


def test_the_desktops_page_shows_each_rows_month_and_the_fleets_measured_at_most_once_a_while(
    client, members, workspace, fleet, plan, monkeypatch
):
    monkeypatch.setattr(billing_selectors, "SPEND_SHOWN_FOR", 1)  # seconds, in the cache's own clock
    client.force_login(members[Role.VIEWER].user)
    url = f"/w/{workspace.id}/desktops/"
    with time_machine.travel(NOW, tick=False):
        page = client.get(url).content.decode()
        alpha_row = page[page.index('data-desktop="' + fleet[0].id) :].split("</tr>")[0]
        assert "€1.12" in alpha_row  # 10 h running and 120 GiB-hours, as on its own page
        assert 'data-figure="spent">€2.82<' in page  # the workspace's whole month, models included
        # A desktop that starts costing shows in the list once the figure shown expires, not at once.
        gamma = DesktopFactory(workspace=workspace, plan=plan, name="gamma")
        history(gamma, (at(3, 0), DesktopState.RUNNING), (at(3, 10), DesktopState.STOPPED))
        assert 'data-figure="spent">€2.82<' in client.get(url).content.decode()
        time.sleep(1.1)
        assert 'data-figure="spent">€3.82<' in client.get(url).content.decode()
