"""The tiers and plan prices a new installation starts with; support changes them in the admin."""

from decimal import Decimal

from django.apps import apps as global_apps

# name, fee, included usage, desktops, running at once, disk GiB, monthly spend cap (EUR)
TIERS = [
    # The beta's free offer: its cap equals what it includes, so it never owes anything.
    ("free", "0", "15", 5, 3, 50, "15"),
    ("team", "29", "0", 25, 10, 500, "500"),
    ("business", "99", "0", 200, 50, 4000, "5000"),
]

# plan name: EUR per running hour (≈ the plan's list price a month when always on), EUR per GiB-month
PLAN_PRICES = {
    "starter": ("0.026", "0.05"),
    "pro": ("0.067", "0.05"),
    "power": ("0.135", "0.05"),
}


def seed_tiers(tier_model, using: str = "default") -> None:
    """Create the tiers that are missing; never change one support may have edited."""
    for name, fee, included, desktops, running, disk, cap in TIERS:
        tier_model.objects.using(using).get_or_create(
            name=name,
            defaults={
                "monthly_fee": Decimal(fee),
                "included_usage": Decimal(included),
                "max_desktops": desktops,
                "max_running": running,
                "max_disk_gib": disk,
                "monthly_spend_cap": Decimal(cap),
            },
        )


def tiers_ensure(sender, using: str = "default", apps=global_apps, **kwargs) -> None:
    """After every migrate, and every flush of a test database, the tiers exist (as the default site does)."""
    try:
        tier_model = apps.get_model("billing", "Tier")
    except LookupError:  # migrated back to before billing existed
        return
    seed_tiers(tier_model, using)
