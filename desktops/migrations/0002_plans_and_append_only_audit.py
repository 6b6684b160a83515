from decimal import Decimal

from django.db import migrations

PLANS = [
    # name, vCPU, memory MiB, disk GiB, EUR per month
    ("starter", 1, 2048, 10, Decimal("19.00")),
    ("pro", 2, 4096, 30, Decimal("49.00")),
    ("power", 4, 8192, 80, Decimal("99.00")),
]


def seed_plans(apps, schema_editor):
    Plan = apps.get_model("desktops", "Plan")
    for name, vcpus, memory_mib, disk_gib, price in PLANS:
        Plan.objects.update_or_create(
            id=f"plan_{name}",
            defaults={
                "name": name,
                "vcpus": vcpus,
                "memory_mib": memory_mib,
                "disk_gib": disk_gib,
                "monthly_price": price,
            },
        )


APPEND_ONLY = """
CREATE FUNCTION desktops_auditevent_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the audit trail is append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER desktops_auditevent_append_only
    BEFORE UPDATE OR DELETE ON desktops_auditevent
    FOR EACH ROW EXECUTE FUNCTION desktops_auditevent_append_only();
"""

DROP_APPEND_ONLY = """
DROP TRIGGER desktops_auditevent_append_only ON desktops_auditevent;
DROP FUNCTION desktops_auditevent_append_only();
"""


class Migration(migrations.Migration):
    dependencies = [("desktops", "0001_initial")]

    operations = [
        migrations.RunPython(seed_plans, migrations.RunPython.noop),
        migrations.RunSQL(APPEND_ONLY, DROP_APPEND_ONLY),
    ]
