"""Money: what a desktop has cost so far under its plan's flat monthly price."""

from datetime import timedelta
from decimal import Decimal

from django.utils import timezone

# A month of billing, as cloud providers count it.
MONTH = timedelta(days=30)


def desktop_cost_so_far(desktop) -> Decimal:
    """The plan's monthly price prorated over the desktop's life (its disk is kept while stopped)."""
    end = desktop.state_changed_at if desktop.state == "destroyed" else timezone.now()
    share = Decimal((end - desktop.created_at) / MONTH)
    return (desktop.plan.monthly_price * share).quantize(Decimal("0.01"))
