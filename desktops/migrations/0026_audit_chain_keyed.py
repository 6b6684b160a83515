"""The audit chain's hashes become HMACs under a key the database does not hold (AUDIT_CHAIN_KEY):
the events written before are chained again, from the latest checkpoint on (what it covers is gone)."""

import hashlib

from django.db import migrations

from desktops.audit import event_canonical, event_digest

# Chaining again needs UPDATE, which the append-only trigger refuses.
UNLOCK = "ALTER TABLE desktops_auditevent DISABLE TRIGGER desktops_auditevent_append_only"
LOCK = "ALTER TABLE desktops_auditevent ENABLE TRIGGER desktops_auditevent_append_only"


def plain_digest(event) -> str:
    """The hash of the chain before this migration (plain SHA-256), for going back to it."""
    return hashlib.sha256(event_canonical(event).encode()).hexdigest()


def rechain(digest):
    def run(apps, schema_editor):
        AuditEvent = apps.get_model("desktops", "AuditEvent")
        AuditChainHead = apps.get_model("desktops", "AuditChainHead")
        AuditCheckpoint = apps.get_model("desktops", "AuditCheckpoint")
        checkpoint = AuditCheckpoint.objects.order_by("-seq").first()
        previous = checkpoint.hash if checkpoint else ""
        head = AuditChainHead.objects.filter(pk=1).first()
        if head is None:
            return
        schema_editor.execute(UNLOCK)
        batch, chained = [], 0
        events = AuditEvent.objects.filter(seq__gt=checkpoint.seq if checkpoint else 0, seq__lte=head.seq)
        for event in events.order_by("seq").iterator(chunk_size=2000):
            event.prev_hash = previous
            event.hash = previous = digest(event)
            batch.append(event)
            chained += 1
            if len(batch) == 2000:
                AuditEvent.objects.bulk_update(batch, ["prev_hash", "hash"])
                batch = []
        AuditEvent.objects.bulk_update(batch, ["prev_hash", "hash"])
        schema_editor.execute(LOCK)
        if chained:
            head.hash = previous
            head.save(update_fields=["hash"])

    return run


class Migration(migrations.Migration):
    dependencies = [("desktops", "0025_schedule_created_with_key")]

    operations = [migrations.RunPython(rechain(event_digest), rechain(plain_digest))]
