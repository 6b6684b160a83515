"""What desktops cost and use: money under the plan's flat monthly price, and their agents' model usage."""

from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal

from django.db.models import Count, Sum
from django.utils import timezone

from desktops.models import ChatMessage

# A month of billing, as cloud providers count it.
MONTH = timedelta(days=30)


def desktop_cost_so_far(desktop) -> Decimal:
    """The plan's monthly price prorated over the desktop's life (its disk is kept while stopped)."""
    end = desktop.state_changed_at if desktop.state == "destroyed" else timezone.now()
    share = Decimal((end - desktop.created_at) / MONTH)
    return (desktop.plan.monthly_price * share).quantize(Decimal("0.01"))


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
