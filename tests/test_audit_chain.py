"""The audit trail's hash chain on real PostgreSQL: whoever edits or deletes rows behind the platform's back
(a database superuser, triggers switched off) is named by `manage.py audit_verify`; pruning keeps what
remains verifiable behind a signed checkpoint; concurrent writers never fork the chain."""

import importlib
import io
import json
import os
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
import time_machine
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import ProgrammingError, connection, transaction
from django.utils import translation

from desktops.audit import SYSTEM, audit_chain_verify, audit_prune, audit_record, event_digest
from desktops.models import AuditCheckpoint, AuditEvent
from workers import tasks


def _verify() -> str:
    """The command's verdict: its output when intact, its error when broken."""
    try:
        out = io.StringIO()
        call_command("audit_verify", stdout=out)
    except CommandError as exc:
        return f"broken: {exc}"
    return out.getvalue()


def _behind_the_back(sql: str, params=()) -> None:
    """What a database superuser can do: switch the append-only triggers off for one statement."""
    with connection.cursor() as cursor:
        cursor.execute("SET session_replication_role = replica")
        cursor.execute(sql, params)
        cursor.execute("SET session_replication_role = DEFAULT")


@pytest.fixture
def trail(db):
    return [
        audit_record(actor=SYSTEM, action="test.step", target=f"dsk_{i}", n=i, ratio=1e20, note="é")
        for i in range(5)
    ]


@pytest.fixture
def checkpoint_key(settings):
    settings.AUDIT_CHECKPOINT_KEY = "checkpoint-key-for-tests"
    settings.AUDIT_RETENTION_DAYS = 30


def test_each_event_carries_the_hash_of_the_one_before(trail):
    assert [e.seq for e in trail] == [1, 2, 3, 4, 5]
    assert [e.prev_hash for e in trail[1:]] == [e.hash for e in trail[:-1]] and trail[0].prev_hash == ""
    assert _verify() == "Audit chain intact: 5 events verified.\n"


def test_an_edited_row_is_caught(trail):
    _behind_the_back("UPDATE desktops_auditevent SET actor = 'user:someone-else' WHERE seq = 3")
    assert _verify().startswith("broken: Audit chain broken at event #3: event #3 ")
    assert f"({trail[2].id}) was altered after it was written (2 events verified before it)" in _verify()


def test_an_edited_row_whose_hash_was_recomputed_is_caught_at_the_next_link(trail):
    forged = AuditEvent.objects.get(seq=3)
    forged.detail = {"n": 99}

    _behind_the_back(
        "UPDATE desktops_auditevent SET detail = %s::jsonb, hash = %s WHERE seq = 3",
        ['{"n": 99}', event_digest(forged)],
    )
    assert "Audit chain broken at event #4: event #4" in _verify()
    assert "does not follow the event before it" in _verify()


def test_the_apps_own_role_cannot_chain_forged_rows_without_the_key(trail, settings):
    """With the app's database role alone (it owns the table: triggers off, rows rewritten), an attacker
    used to edit an event, chain every later one again and move the head: the trail verified intact."""
    forged = AuditEvent.objects.get(seq=3)
    forged.detail = {"n": 99}
    later = list(AuditEvent.objects.filter(seq__gte=3).order_by("seq"))
    later[0] = forged
    previous = AuditEvent.objects.get(seq=2).hash
    settings.AUDIT_CHAIN_KEY = "what the database can tell: not the platform's key"
    rewritten = []
    for event in later:
        event.prev_hash = previous
        event.hash = previous = event_digest(event)
        rewritten.append(event)
    settings.AUDIT_CHAIN_KEY = ""
    for event in rewritten:
        _behind_the_back(
            "UPDATE desktops_auditevent SET detail = %s::jsonb, prev_hash = %s, hash = %s WHERE seq = %s",
            [json.dumps(event.detail), event.prev_hash, event.hash, event.seq],
        )
    _behind_the_back("UPDATE desktops_auditchainhead SET hash = %s", [previous])
    assert "Audit chain broken at event #3: event #3" in _verify()


@pytest.mark.django_db(transaction=True)
def test_the_migration_that_keys_the_chain_hashes_it_again_both_ways():
    for i in range(3):
        audit_record(actor=SYSTEM, action="test.step", n=i)
    keyed = importlib.import_module("desktops.migrations.0026_audit_chain_keyed")
    call_command("migrate", "desktops", "0025", verbosity=0)
    try:
        # Back before it, the chain is the plain SHA-256 one that the code of then verifies.
        events = list(AuditEvent.objects.order_by("seq"))
        assert [e.hash for e in events] == [keyed.plain_digest(e) for e in events]
        assert [e.prev_hash for e in events[1:]] == [e.hash for e in events[:-1]]
    finally:
        call_command("migrate", "desktops", verbosity=0)
    assert _verify() == "Audit chain intact: 3 events verified.\n"


def test_a_deleted_row_is_caught(trail):
    _behind_the_back("DELETE FROM desktops_auditevent WHERE seq = 2")
    assert "Audit chain broken at event #2: events #2 to #2 are missing" in _verify()


def test_deleting_the_newest_rows_is_caught(trail):
    _behind_the_back("DELETE FROM desktops_auditevent WHERE seq >= 4")
    assert (
        "Audit chain broken at event #4: events #4 to #5 are missing (3 events verified before it)"
        in _verify()
    )


def test_a_forged_checkpoint_is_caught(trail, checkpoint_key):
    # Without superuser rights the trigger lets deletes through behind a checkpoint; without the key
    # nobody can sign one.
    AuditCheckpoint.objects.create(seq=3, hash=trail[2].hash, signature="0" * 64)
    AuditEvent.objects.filter(seq__lte=3).delete()
    assert AuditEvent.objects.count() == 2
    assert "event #3: the checkpoint at event #3 is not signed with this platform's key" in _verify()


def test_pruning_leaves_a_signed_checkpoint_the_rest_verifies_from(trail, checkpoint_key):
    # Thirty days after the third event was written, the first two are past retention.
    assert audit_prune(now=trail[2].at + timedelta(days=30)) == 2
    checkpoint = AuditCheckpoint.objects.get()
    assert (checkpoint.seq, checkpoint.hash) == (2, trail[1].hash)
    assert list(AuditEvent.objects.order_by("seq").values_list("seq", flat=True)) == [3, 4, 5, 6]
    pruned = AuditEvent.objects.get(seq=6)
    assert (pruned.action, pruned.detail) == ("audit.pruned", {"through": 2, "events": 2})
    assert _verify() == "Audit chain intact: 4 events verified.\n"
    # What the checkpoint does not cover stays undeletable, and the checkpoint itself unchangeable.
    with pytest.raises(ProgrammingError, match="append-only"), transaction.atomic():
        AuditEvent.objects.filter(seq=3).delete()
    with pytest.raises(ProgrammingError, match="append-only"), transaction.atomic():
        AuditCheckpoint.objects.update(seq=5)
    # And tampering after a checkpoint is still caught, from the checkpoint on.
    _behind_the_back("UPDATE desktops_auditevent SET target = 'dsk_x' WHERE seq = 4")
    assert "Audit chain broken at event #4: event #4" in _verify()


def test_a_checkpoint_signed_with_another_key_is_caught(trail, checkpoint_key, settings):
    audit_prune(now=trail[2].at + timedelta(days=30))
    settings.AUDIT_CHECKPOINT_KEY = "another-key"
    assert "is not signed with this platform's key" in _verify()


def test_pruning_does_nothing_without_retention(trail, settings):
    settings.AUDIT_RETENTION_DAYS = 0
    assert audit_prune(now=trail[-1].at + timedelta(days=3650)) == 0
    assert AuditEvent.objects.count() == 5 and not AuditCheckpoint.objects.exists()


def test_pruning_everything_past_retention_keeps_the_chain_verifiable(trail, checkpoint_key):
    assert audit_prune(now=trail[-1].at + timedelta(days=31)) == 5
    assert AuditCheckpoint.objects.get().seq == 5
    assert _verify() == "Audit chain intact: 1 events verified.\n"
    assert audit_record(actor=SYSTEM, action="test.after").prev_hash == AuditEvent.objects.get(seq=6).hash
    assert audit_chain_verify().broken is None


@pytest.mark.django_db(transaction=True)
def test_concurrent_writers_never_chain_onto_the_same_event():
    """Eight threads on their own connections append at once, each holding its transaction open a moment
    after its event (as a request does): appends take their turn, and the chain stays one line."""
    writers, each = 8, 5
    gate = threading.Barrier(writers)
    failures: list[BaseException] = []

    def write(i):
        try:
            gate.wait()
            for n in range(each):
                with transaction.atomic():
                    audit_record(actor=SYSTEM, action="test.concurrent", target=f"writer-{i}", n=n)
                    threading.Event().wait(0.01)
        except BaseException as exc:  # reported below, the thread would swallow it
            failures.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    events = list(AuditEvent.objects.order_by("seq"))
    assert [e.seq for e in events] == list(range(1, writers * each + 1))
    assert len({e.prev_hash for e in events}) == writers * each
    assert audit_chain_verify().broken is None


INSERT_OLD_EVENT = (
    "INSERT INTO desktops_auditevent (id, at, actor, workspace_id, action, target, ip, request_id, detail)"
    " VALUES (%s, %s, 'system:old', '', 'old.event', '', '10.0.0.1', '', %s::jsonb)"
)


@pytest.mark.django_db(transaction=True)
def test_the_migration_chains_the_events_written_before_it():
    call_command("migrate", "desktops", "0019", verbosity=0)
    try:
        with connection.cursor() as cursor:
            for i, at in enumerate(
                ["2026-01-02 10:00:00+00", "2026-01-01 09:00:00+00", "2026-01-03 08:00:00+00"]
            ):
                cursor.execute(
                    INSERT_OLD_EVENT,
                    [f"aud_old{i}", at, '{"size": 1.5e20}'],
                )
    finally:
        call_command("migrate", "desktops", verbosity=0)
    assert list(AuditEvent.objects.order_by("seq").values_list("id", flat=True)) == [
        "aud_old1",
        "aud_old0",
        "aud_old2",
    ]
    assert _verify() == "Audit chain intact: 3 events verified.\n"
    assert audit_record(actor=SYSTEM, action="test.after").seq == 4
    _behind_the_back("UPDATE desktops_auditevent SET at = at + interval '1 second' WHERE id = 'aud_old0'")
    assert "Audit chain broken at event #2" in _verify()


def _scheduled_in_a_fresh_process(job: str, **env) -> subprocess.CompletedProcess:
    """Whether beat would run `job`, with the settings these environment variables make."""
    script = f"from django.conf import settings; print({job!r} in settings.CELERY_BEAT_SCHEDULE)"
    return subprocess.run(
        [sys.executable, "-c", f"import django; django.setup(); {script}"],
        env={**os.environ, "DJANGO_SETTINGS_MODULE": "lebureau.settings", **env},
        capture_output=True,
        text=True,
    )


def test_beat_prunes_only_when_retention_is_set_and_needs_a_key():
    assert _scheduled_in_a_fresh_process("audit-prune", AUDIT_RETENTION_DAYS="0").stdout == "False\n"
    assert (
        _scheduled_in_a_fresh_process(
            "audit-prune", AUDIT_RETENTION_DAYS="90", AUDIT_CHECKPOINT_KEY="k"
        ).stdout
        == "True\n"
    )
    refused = _scheduled_in_a_fresh_process("audit-prune", AUDIT_RETENTION_DAYS="90", AUDIT_CHECKPOINT_KEY="")
    assert refused.returncode != 0 and "AUDIT_RETENTION_DAYS needs AUDIT_CHECKPOINT_KEY" in refused.stderr


def test_the_beat_task_prunes(trail, checkpoint_key):
    with time_machine.travel(trail[-1].at + timedelta(days=31)):
        assert tasks.audit_prune() == 5
    assert _verify() == "Audit chain intact: 1 events verified.\n"


def test_the_verdict_speaks_french(trail):
    _behind_the_back("DELETE FROM desktops_auditevent WHERE seq = 2")
    with translation.override("fr"):
        assert audit_chain_verify().broken.reason == "les événements n° 2 à n° 2 manquent"


def _cut_after(seq: int) -> None:
    """What the app's own role can do without the chain's key: delete the newest events and move the head
    back onto the last one it keeps, so that the chain it leaves verifies as whole."""
    kept = AuditEvent.objects.get(seq=seq)
    _behind_the_back("DELETE FROM desktops_auditevent WHERE seq > %s", [seq])
    _behind_the_back("UPDATE desktops_auditchainhead SET seq = %s, hash = %s", [seq, kept.hash])


def _exported_lines(settings) -> list[dict]:
    with open(settings.AUDIT_HEAD_LOG) as log:
        return [json.loads(line) for line in log]


def test_cutting_the_newest_events_is_caught_by_the_head_exported_before(trail, settings):
    assert tasks.audit_head_export() is True
    exported_at = _exported_lines(settings)[-1]["at"]
    assert _verify() == (
        f"Audit chain intact: 5 events verified.\nIt holds the head exported at {exported_at} (event #5).\n"
    )
    _cut_after(3)
    # The hole this closes: the chain left behind is whole, and without the exported head nothing shows.
    exported_to, settings.AUDIT_HEAD_LOG = settings.AUDIT_HEAD_LOG, ""
    assert _verify() == "Audit chain intact: 3 events verified.\n"
    settings.AUDIT_HEAD_LOG = exported_to
    assert _verify() == (
        "broken: Audit chain broken at event #4: events #4 to #5 were cut: the head exported at "
        f"{exported_at} was at #5 (or the database was restored from a backup older than that) "
        "(3 events verified before it)."
    )
    # Events written since fill the gap with others: the exported one is still missed, and the exporter
    # never writes a head that would bless the cut.
    for i in range(3):
        audit_record(actor=SYSTEM, action="test.after", n=i)
    assert tasks.audit_head_export() is False
    assert len(_exported_lines(settings)) == 1
    assert _verify() == (
        f"broken: Audit chain broken at event #5: event #5 is not the one exported at {exported_at}: "
        "the chain was cut there and written again (6 events verified before it)."
    )


def test_wiping_the_whole_trail_is_caught(trail):
    tasks.audit_head_export()
    _behind_the_back("DELETE FROM desktops_auditevent")
    _behind_the_back("DELETE FROM desktops_auditchainhead")
    assert "Audit chain broken at event #1: the chain's head is missing" in _verify()


def test_a_head_written_into_the_log_without_the_key_is_caught(trail, settings):
    tasks.audit_head_export()
    _cut_after(3)
    # Whoever can also write the log appends a head that matches the cut chain, but cannot sign it.
    with open(settings.AUDIT_HEAD_LOG, "a") as log:
        kept = AuditEvent.objects.get(seq=3)
        log.write(
            json.dumps({"seq": 3, "hash": kept.hash, "at": "2026-12-04T00:00:00+00:00", "mac": "0" * 64})
            + "\n"
        )
    assert (
        f"Audit chain broken at event #3: the last head in {settings.AUDIT_HEAD_LOG} is not signed with this "
        "platform's key" in _verify()
    )
    with open(settings.AUDIT_HEAD_LOG, "a") as log:
        log.write("not a head\n")
    assert "is not signed with this platform's key" in _verify()


def test_the_head_is_exported_only_when_it_moved_and_pruning_keeps_it_verifiable(
    trail, settings, checkpoint_key
):
    assert [tasks.audit_head_export(), tasks.audit_head_export()] == [True, False]
    audit_record(actor=SYSTEM, action="test.after")
    assert tasks.audit_head_export() is True
    assert [(line["seq"], line["hash"]) for line in _exported_lines(settings)] == [
        (5, trail[-1].hash),
        (6, AuditEvent.objects.get(seq=6).hash),
    ]
    assert os.stat(settings.AUDIT_HEAD_LOG).st_mode & 0o777 == 0o600
    # Everything exported pruned behind a checkpoint: the checkpoint vouches for it.
    audit_prune(now=trail[-1].at + timedelta(days=3650))
    assert audit_chain_verify().broken is None
    assert tasks.audit_head_export() is True


def test_beat_exports_the_head_unless_told_not_to():
    assert _scheduled_in_a_fresh_process("audit-head-export").stdout == "True\n"
    assert _scheduled_in_a_fresh_process("audit-head-export", AUDIT_HEAD_LOG="").stdout == "False\n"
