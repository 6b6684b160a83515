"""What desktops cost and use, and what a workspace may still use: reads, scoped to the actor."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal

from allauth.account.models import EmailAddress
from django.conf import settings
from django.core.cache import cache
from django.db.models import Count, Q, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from billing.metering import (
    ZERO,
    Meter,
    Span,
    days_of,
    gib_hours,
    midnight,
    month_of,
    next_month,
    running_peaks,
    state_spans,
    state_time,
    this_month,
)
from billing.models import (
    HOURS_PER_MONTH,
    ModelPrice,
    PlanPrice,
    SpendAlert,
    StorageDay,
    Tier,
)
from desktops.agent_config import PROVIDERS
from desktops.audit import Actor
from desktops.models import ChatMessage, Desktop, DesktopEvent, Plan, Role, Workspace
from desktops.models import DesktopState as S
from desktops.selectors import desktop_get, plan_list, workspace_get

# Desktops that run or are on their way to running: what the "running at once" quota counts.
ACTIVE = (S.PROVISIONING, S.STARTING, S.RUNNING, S.RESUMING)


# Tiers and prices


def tier_list() -> QuerySet[Tier]:
    """The tiers offered, for the pricing page (anyone, signed in or not)."""
    return Tier.objects.filter(is_public=True)


def tier_default() -> Tier:
    return Tier.objects.get(name=settings.DEFAULT_TIER)


def tier_of(workspace: Workspace) -> Tier:
    """The workspace's tier; one made outside the services (the admin's add form) is on the default."""
    tier = Tier.objects.filter(subscriptions__workspace=workspace).first()
    return tier or tier_default()


def confirmation_awaited(*, workspace: Workspace) -> bool:
    """Whether the workspace's desktops wait for an owner to confirm their e-mail address: on a tier
    without a fee, as addresses are free to make and each would otherwise bring its free quotas."""
    if not settings.FREE_TIER_NEEDS_CONFIRMED_EMAIL or tier_of(workspace).monthly_fee != 0:
        return False
    return not EmailAddress.objects.filter(
        verified=True, user__memberships__workspace=workspace, user__memberships__role=Role.OWNER
    ).exists()


def price_of(plan: Plan) -> PlanPrice:
    """The plan's prices; a plan support added without any is free until they set them."""
    try:
        return plan.price
    except PlanPrice.DoesNotExist:
        return PlanPrice(plan=plan, hourly=ZERO, storage_gib_month=ZERO)


def plan_prices() -> list[tuple[Plan, PlanPrice]]:
    """The plans on offer with their prices, cheapest first."""
    return [(plan, price_of(plan)) for plan in plan_list().select_related("price")]


def model_price_list(*, workspace: Workspace) -> QuerySet[ModelPrice]:
    return workspace.model_prices.all()


def agent_model(workspace: Workspace) -> str:
    """The model the workspace's agents ask first: its newest LLM key's (answers do not record theirs)."""
    key = workspace.llm_keys.order_by("-created_at").first()
    return (key.model or PROVIDERS[key.provider][2]) if key else ""


def token_price(workspace: Workspace) -> tuple[str, ModelPrice | None]:
    """The model the agents' tokens are priced at, and its price if the workspace set one."""
    model = agent_model(workspace)
    return model, workspace.model_prices.filter(model=model).first()


# Usage and costs


@dataclass
class DesktopCosts:
    desktop: Desktop
    meter: Meter
    days: dict[date, Meter]


@dataclass
class DayCosts:
    day: date
    meter: Meter
    running_peak: int


@dataclass
class MonthCosts:
    """A workspace's month: per desktop, per day, and what it owes."""

    workspace: Workspace
    month: date
    tier: Tier
    meter: Meter
    desktops: list[DesktopCosts]  # the biggest spender first
    days: list[DayCosts]
    model: str  # what the tokens are priced at
    model_price: ModelPrice | None
    included: Decimal = ZERO
    credits: Decimal = ZERO
    owed: Decimal = ZERO
    alerts: list[SpendAlert] = field(default_factory=list)

    @property
    def cap_used(self) -> int | None:
        """Percent of the spend cap used, when the tier has a cap."""
        cap = self.tier.monthly_spend_cap
        return None if not cap else int(self.meter.total * 100 / cap)


def costs_of_workspace(*, actor: Actor, workspace_id: str, month: date) -> MonthCosts:
    workspace = workspace_get(actor=actor, workspace_id=workspace_id)
    return month_costs(workspace=workspace, month=month)


def costs_of_desktop(*, actor: Actor, desktop_id: str, month: date) -> DesktopCosts:
    desktop = desktop_get(actor=actor, desktop_id=desktop_id)
    costs, _ = _measure(Desktop.objects.filter(id=desktop.id), desktop.workspace, month, timezone.now())
    return costs[0] if costs else DesktopCosts(desktop, Meter(), {})


def month_costs(*, workspace: Workspace, month: date) -> MonthCosts:
    """Everything the costs page and API show; the month so far when it is this one."""
    now = timezone.now()
    start, end = midnight(month), midnight(next_month(month))
    desktops, spans = _measure(workspace.desktops.all(), workspace, month, now)
    peaks = running_peaks(span for desktop_spans in spans.values() for span in desktop_spans)
    days = [
        DayCosts(day, Meter.sum(d.days.get(day, Meter()) for d in desktops), peaks.get(day, 0))
        for day in days_of(start, min(end, now))
    ]
    tier = tier_of(workspace)
    model, model_price = token_price(workspace)
    costs = MonthCosts(
        workspace=workspace,
        month=month,
        tier=tier,
        meter=Meter.sum(d.meter for d in desktops),
        desktops=sorted(desktops, key=lambda d: (-d.meter.total, d.desktop.name)),
        days=days,
        model=model,
        model_price=model_price,
        alerts=list(workspace.spend_alerts.filter(month=month)),
    )
    due = _billable(tier, costs.meter.platform)
    costs.included = min(tier.included_usage, costs.meter.platform)
    costs.credits = min(due, _credit_left(workspace, tier, month))
    costs.owed = due - costs.credits
    return costs


@dataclass(frozen=True)
class FleetSpend:
    total: Decimal
    by_desktop: dict[str, Decimal]


def fleet_spend(workspace: Workspace) -> FleetSpend:
    """What the workspace's fleet has spent this month so far, models included: in all and per desktop."""
    measured, _ = _measure(workspace.desktops.all(), workspace, this_month(), timezone.now())
    return FleetSpend(
        total=Meter.sum(d.meter for d in measured).total,
        by_desktop={d.desktop.id: d.meter.total for d in measured},
    )


def spend_this_month(workspace: Workspace) -> Decimal:
    return fleet_spend(workspace).total


# Measuring a thousand desktops' month takes longer than a page should: pages show figures at most
# this old (quotas and caps always measure anew).
SPEND_SHOWN_FOR = 60


def fleet_spend_shown(workspace: Workspace) -> FleetSpend:
    """`fleet_spend` for the pages: measured at most once a minute (one measure of the whole fleet
    serves every page of the list)."""
    key = f"billing.fleet-spend:{workspace.id}:{this_month()}"
    spend = cache.get(key)
    if spend is None:
        spend = fleet_spend(workspace)
        cache.set(key, spend, SPEND_SHOWN_FOR)
    return spend


def _billable(tier: Tier, platform: Decimal) -> Decimal:
    return tier.monthly_fee + max(ZERO, platform - tier.included_usage)


def _credit_left(workspace: Workspace, tier: Tier, month: date) -> Decimal:
    """Credits granted by the end of `month` that the months before it have not used (oldest first)."""
    grants = list(workspace.credit_grants.filter(created_at__lt=midnight(next_month(month))))
    if not grants:
        return ZERO
    left, current = ZERO, month_of(timezone.localtime(min(g.created_at for g in grants)).date())
    while current < month:
        end = midnight(next_month(current))
        left += sum((g.amount for g in grants if midnight(current) <= g.created_at < end), ZERO)
        measured, _ = _measure(workspace.desktops.all(), workspace, current, end)
        left -= min(left, _billable(tier, Meter.sum(d.meter for d in measured).platform))
        current = next_month(current)
    return left + sum((g.amount for g in grants if g.created_at >= midnight(month)), ZERO)


def _spans(desktop_ids: list[str], start: datetime, end: datetime) -> dict[str, list[Span]]:
    opening = dict(
        DesktopEvent.objects.filter(desktop_id__in=desktop_ids, created_at__lt=start)
        .order_by("desktop_id", "-created_at")
        .distinct("desktop_id")
        .values_list("desktop_id", "to_state")
    )
    events = (
        DesktopEvent.objects.filter(desktop_id__in=desktop_ids, created_at__gte=start, created_at__lt=end)
        .order_by("created_at")
        .values_list("desktop_id", "created_at", "to_state")
    )
    return state_spans(opening, events, start, end)


def _measure(
    desktops: QuerySet[Desktop], workspace: Workspace, month: date, now: datetime
) -> tuple[list[DesktopCosts], dict[str, list[Span]]]:
    """Usage and cost of the desktops that lived in the month, per desktop and day; and their states."""
    start, end = midnight(month), midnight(next_month(month))
    until = min(end, now)
    lived = list(
        desktops.filter(created_at__lt=until)
        .exclude(state=S.DESTROYED, state_changed_at__lt=start)
        .select_related("plan__price", "disk_meter")
    )
    ids = [d.id for d in lived]
    spans = _spans(ids, start, until)
    days: dict[str, dict[date, Meter]] = {desktop_id: state_time(s) for desktop_id, s in spans.items()}
    for desktop_id, day, value in _storage(lived, month, until):
        days.setdefault(desktop_id, {}).setdefault(day, Meter()).gib_hours += value
    tokens = (
        ChatMessage.objects.filter(
            desktop_id__in=ids,
            author=ChatMessage.Author.AGENT,
            completed_at__gte=start,
            completed_at__lt=until,
        )
        .annotate(day=TruncDate("completed_at"))
        .values("desktop_id", "day")
        .annotate(input=Sum("input_tokens"), output=Sum("output_tokens"))
    )
    for row in tokens:
        meter = days.setdefault(row["desktop_id"], {}).setdefault(row["day"], Meter())
        meter.input_tokens, meter.output_tokens = row["input"], row["output"]
    _, model_price = token_price(workspace)
    measured = []
    for desktop in lived:
        price = price_of(desktop.plan)
        for meter in days.get(desktop.id, {}).values():
            _charge(meter, price, model_price)
        desktop_days = dict(sorted(days.get(desktop.id, {}).items()))
        measured.append(DesktopCosts(desktop, Meter.sum(desktop_days.values()), desktop_days))
    return measured, spans


def _storage(desktops: list[Desktop], month: date, until: datetime):
    """(desktop, day, GiB-hours): the days counted so far, and the last measure held since then."""
    counted = StorageDay.objects.filter(
        desktop_id__in=[d.id for d in desktops], day__gte=month, day__lt=next_month(month)
    )
    yield from counted.values_list("desktop_id", "day", "gib_hours")
    for desktop in desktops:
        meter = getattr(desktop, "disk_meter", None)
        if meter is not None:
            since = max(meter.counted_until, midnight(month))
            for day, value in gib_hours(meter.bytes, since, min(until, meter_end(desktop, until))):
                yield desktop.id, day, value


def meter_end(desktop: Desktop, now: datetime) -> datetime:
    """Until when a desktop's disk counts: its destruction, or now."""
    return desktop.state_changed_at if desktop.state == S.DESTROYED else now


def _charge(meter: Meter, price: PlanPrice, model_price: ModelPrice | None) -> None:
    meter.compute = meter.running_hours * price.hourly
    meter.storage = meter.gib_hours * price.storage_gib_month / HOURS_PER_MONTH
    if model_price is not None:
        meter.models = (
            meter.input_tokens * model_price.input_per_million
            + meter.output_tokens * model_price.output_per_million
        ) / 1_000_000


# Quotas


@dataclass(frozen=True)
class Quota:
    used: int | Decimal
    limit: int | Decimal | None  # None: no limit

    @property
    def percent(self) -> int | None:
        return None if not self.limit else int(self.used * 100 / self.limit)


@dataclass(frozen=True)
class QuotaUsage:
    tier: Tier
    desktops: Quota
    running: Quota
    disk_gib: Quota
    spend: Quota


def quota_usage(*, workspace: Workspace, exclude: str = "") -> QuotaUsage:
    """What the workspace uses of its tier now; `exclude` leaves one desktop out of the running count."""
    tier = tier_of(workspace)
    live = workspace.desktops.exclude(state=S.DESTROYED)
    counts = live.aggregate(
        desktops=Count("id"),
        running=Count("id", filter=Q(state__in=ACTIVE) & ~Q(id=exclude)),
        disk=Sum("plan__disk_gib", default=0),
    )
    return QuotaUsage(
        tier=tier,
        desktops=Quota(counts["desktops"], tier.max_desktops),
        running=Quota(counts["running"], tier.max_running),
        disk_gib=Quota(counts["disk"], tier.max_disk_gib),
        spend=Quota(spend_this_month(workspace), tier.monthly_spend_cap),
    )


def quota_of(*, actor: Actor, workspace_id: str) -> QuotaUsage:
    return quota_usage(workspace=workspace_get(actor=actor, workspace_id=workspace_id))


def spend_alerts_this_month(*, workspace: Workspace) -> list[SpendAlert]:
    return list(workspace.spend_alerts.filter(month=this_month()))


# The agents' model usage, as their runtime reported it


@dataclass(frozen=True)
class AgentUsage:
    """What a desktop's agent asked of its model, as the agent runtime reported it, turn by turn."""

    input_tokens: int = 0
    output_tokens: int = 0
    requests: int = 0
    turns: int = 0


_TOTALS = {
    "input_tokens": Sum("input_tokens", default=0),
    "output_tokens": Sum("output_tokens", default=0),
    "requests": Sum("model_requests", default=0),
    "turns": Count("id"),
}


def _answers():
    return ChatMessage.objects.filter(author=ChatMessage.Author.AGENT, completed_at__isnull=False)


def agent_usage_of_desktop(desktop) -> AgentUsage:
    return AgentUsage(**_answers().filter(desktop=desktop).aggregate(**_TOTALS))


def agent_usage_of_workspace(workspace) -> tuple[AgentUsage, list[tuple[str, str, AgentUsage]]]:
    """The workspace's total and each desktop's (id, name, usage), biggest first; destroyed ones count."""
    rows = (
        _answers()
        .filter(desktop__workspace=workspace)
        .values("desktop_id", "desktop__name")
        .annotate(**_TOTALS)
        .order_by("-output_tokens", "desktop__name")
    )
    per_desktop = [(row.pop("desktop_id"), row.pop("desktop__name"), AgentUsage(**row)) for row in rows]
    total = AgentUsage(
        **{name: sum(getattr(u, name) for _, _, u in per_desktop) for name in AgentUsage.__dataclass_fields__}
    )
    return total, per_desktop
