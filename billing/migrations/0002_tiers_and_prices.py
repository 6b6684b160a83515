from decimal import Decimal

from django.db import migrations

from billing.seed import PLAN_PRICES, seed_tiers


def seed(apps, schema_editor):
    """The starting tiers and plan prices; every workspace there is so far goes on the free tier."""
    Tier = apps.get_model("billing", "Tier")
    seed_tiers(Tier)
    for name, (hourly, storage) in PLAN_PRICES.items():
        plan = apps.get_model("desktops", "Plan").objects.filter(name=name).first()
        if plan is not None:
            apps.get_model("billing", "PlanPrice").objects.get_or_create(
                plan=plan, defaults={"hourly": Decimal(hourly), "storage_gib_month": Decimal(storage)}
            )
    free = Tier.objects.get(name="free")
    Subscription = apps.get_model("billing", "Subscription")
    Subscription.objects.bulk_create(
        [
            Subscription(workspace_id=workspace_id, tier=free)
            for workspace_id in apps.get_model("desktops", "Workspace").objects.values_list("id", flat=True)
        ],
        ignore_conflicts=True,
    )


class Migration(migrations.Migration):
    dependencies = [("billing", "0001_initial")]

    operations = [migrations.RunPython(seed, migrations.RunPython.noop)]
