import django.utils.timezone
from django.db import migrations, models

from desktops.audit import event_digest

# Chaining the events already written needs UPDATE, which the append-only trigger refuses.
UNLOCK = "ALTER TABLE desktops_auditevent DISABLE TRIGGER desktops_auditevent_append_only"
LOCK = "ALTER TABLE desktops_auditevent ENABLE TRIGGER desktops_auditevent_append_only"

# Pruning deletes the events a checkpoint covers, and nothing else; checkpoints stay for good.
PRUNABLE = """
CREATE OR REPLACE FUNCTION desktops_auditevent_append_only() RETURNS trigger AS $$
BEGIN
    IF TG_OP = 'DELETE' AND OLD.seq <= (SELECT coalesce(max(seq), 0) FROM desktops_auditcheckpoint) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'the audit trail is append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE FUNCTION desktops_auditcheckpoint_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'audit checkpoints are append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
CREATE TRIGGER desktops_auditcheckpoint_append_only
    BEFORE UPDATE OR DELETE ON desktops_auditcheckpoint
    FOR EACH ROW EXECUTE FUNCTION desktops_auditcheckpoint_append_only();
"""

UNPRUNABLE = """
DROP TRIGGER desktops_auditcheckpoint_append_only ON desktops_auditcheckpoint;
DROP FUNCTION desktops_auditcheckpoint_append_only();
CREATE OR REPLACE FUNCTION desktops_auditevent_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'the audit trail is append-only (% refused)', TG_OP;
END;
$$ LANGUAGE plpgsql;
"""


def chain_existing_events(apps, schema_editor):
    """Chain the events written before the chain existed, in the order they were written."""
    AuditEvent = apps.get_model("desktops", "AuditEvent")
    AuditChainHead = apps.get_model("desktops", "AuditChainHead")
    seq, previous, batch = 0, "", []
    for event in AuditEvent.objects.order_by("at", "id").iterator(chunk_size=2000):
        seq += 1
        event.seq, event.prev_hash = seq, previous
        event.hash = previous = event_digest(event)
        batch.append(event)
        if len(batch) == 2000:
            AuditEvent.objects.bulk_update(batch, ["seq", "prev_hash", "hash"])
            batch = []
    AuditEvent.objects.bulk_update(batch, ["seq", "prev_hash", "hash"])
    AuditChainHead.objects.create(pk=1, seq=seq, hash=previous)


class Migration(migrations.Migration):
    dependencies = [("desktops", "0019_plan_transfer_max")]

    operations = [
        migrations.CreateModel(
            name="AuditChainHead",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("seq", models.BigIntegerField(default=0)),
                ("hash", models.CharField(blank=True, max_length=64)),
            ],
        ),
        migrations.CreateModel(
            name="AuditCheckpoint",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("seq", models.BigIntegerField(unique=True)),
                ("hash", models.CharField(max_length=64)),
                ("at", models.DateTimeField(default=django.utils.timezone.now)),
                ("signature", models.CharField(max_length=64)),
            ],
        ),
        migrations.AlterField(
            model_name="auditevent",
            name="at",
            field=models.DateTimeField(db_index=True, default=django.utils.timezone.now),
        ),
        migrations.AddField(model_name="auditevent", name="seq", field=models.BigIntegerField(null=True)),
        migrations.AddField(
            model_name="auditevent",
            name="prev_hash",
            field=models.CharField(blank=True, max_length=64, default=""),
        ),
        migrations.AddField(
            model_name="auditevent", name="hash", field=models.CharField(max_length=64, default="")
        ),
        migrations.RunSQL(UNLOCK, LOCK),
        migrations.RunPython(chain_existing_events, migrations.RunPython.noop),
        migrations.RunSQL(LOCK, UNLOCK),
        migrations.AlterField(model_name="auditevent", name="seq", field=models.BigIntegerField(unique=True)),
        migrations.AlterField(
            model_name="auditevent", name="prev_hash", field=models.CharField(blank=True, max_length=64)
        ),
        migrations.AlterField(model_name="auditevent", name="hash", field=models.CharField(max_length=64)),
        migrations.RunSQL(PRUNABLE, UNPRUNABLE),
    ]
