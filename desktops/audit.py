"""Who acts, and the append-only, hash-chained record of what they did."""

from __future__ import annotations

import fcntl
import hashlib
import hmac
import json
import logging
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from django.db.models import Min
from django.utils import timezone
from django.utils.crypto import salted_hmac
from django.utils.translation import gettext as _

from desktops.middleware import current_request
from desktops.models import ApiKey, AuditChainHead, AuditCheckpoint, AuditEvent

log = logging.getLogger(__name__)

# How `Actor.label` names an act through an API key; read back to name the key on the audit page.
KEY_LABEL = re.compile(r"^key:(?P<key>\S+) \((?P<email>.*)\)$")


@dataclass(frozen=True)
class Actor:
    """A person, a person's API key, or the platform itself."""

    user: object | None = None
    api_key: ApiKey | None = None
    system: str = ""
    # Support staff acting from the Django admin, with an owner's rights everywhere.
    support: bool = False

    @property
    def label(self) -> str:
        if self.api_key is not None:
            return f"key:{self.api_key.id} ({self.user.email})"
        if self.user is not None and self.system:  # on a person's behalf, e.g. their schedule
            return f"{self.system} ({self.user.email})"
        if self.user is not None and self.support:
            return f"support:{self.user.email or self.user.get_username()}"
        if self.user is not None:
            return f"user:{self.user.email or self.user.get_username()}"
        return f"system:{self.system}"

    @staticmethod
    def key_of(label: str) -> tuple[str, str] | None:
        """The API key's id and its owner's address in a key's label (`key:ID (EMAIL)`), else None."""
        found = KEY_LABEL.match(label)
        return (found["key"], found["email"]) if found else None

    @classmethod
    def from_request(cls, request) -> Actor:
        api_key = request.auth if isinstance(getattr(request, "auth", None), ApiKey) else None
        user = request.user if request.user.is_authenticated else None
        return cls(user=user, api_key=api_key, system="" if user else "anonymous")


SYSTEM = Actor(system="worker")


def desktop_actor(desktop) -> Actor:
    """A desktop acting through the guest endpoint with its own token: its agent, in effect."""
    return Actor(system=f"desktop:{desktop.id}")


def audit_record(
    *, actor: Actor, action: str, workspace_id: str = "", target: str = "", **detail
) -> AuditEvent:
    """Write one audit event, chained onto the one before it; callers pass ids and facts, never secrets.

    The chain's head stays locked until the caller's transaction ends, so audited transactions take
    their turn; one that rolls back takes its event and the head's move with it.
    """
    context = current_request.get()
    with transaction.atomic():
        head = _locked_head()
        detail, ip = _as_stored(detail, context.ip)
        event = AuditEvent(
            seq=head.seq + 1,
            at=timezone.now(),
            actor=actor.label,
            workspace_id=workspace_id,
            action=action,
            target=target,
            ip=ip,
            request_id=context.request_id,
            detail=detail,
            prev_hash=head.hash,
        )
        event.hash = event_digest(event)
        event.save(force_insert=True)
        head.seq, head.hash = event.seq, event.hash
        head.save(update_fields=["seq", "hash"])
    return event


def event_canonical(event) -> str:
    """Everything an event says, and the hash of the event before it, as one string: what its hash covers."""
    fields = [
        event.seq,
        event.id,
        event.at.astimezone(UTC).isoformat(timespec="microseconds"),
        event.actor,
        event.workspace_id,
        event.action,
        event.target,
        event.ip or "",
        event.request_id,
        event.detail,
        event.prev_hash,
    ]
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def event_digest(event) -> str:
    """HMAC-SHA256 of the event's canonical form, under a key the database does not hold."""
    return _keyed(CHAIN_SALT, event_canonical(event))


def _keyed(salt: str, message: str) -> str:
    key = settings.AUDIT_CHAIN_KEY or settings.SECRET_KEY
    return salted_hmac(salt, message, secret=key, algorithm="sha256").hexdigest()


# Keep the chain's HMACs, and the exported heads', apart from every other use of the same secret.
CHAIN_SALT = "lebureau.audit.chain"
HEAD_SALT = "lebureau.audit.head"


def _locked_head() -> AuditChainHead:
    head = AuditChainHead.objects.select_for_update().filter(pk=1).first()
    if head is None:  # a new database: the first writer creates the head, the others wait on it
        AuditChainHead.objects.bulk_create([AuditChainHead(pk=1)], ignore_conflicts=True)
        head = AuditChainHead.objects.select_for_update().get(pk=1)
    return head


def _as_stored(detail: dict, ip: str | None) -> tuple[dict, str | None]:
    """The detail and address as PostgreSQL will give them back (jsonb rewrites numbers, inet addresses),
    so that the hash computed now is the one a verifier computes from the stored row."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::jsonb, %s::inet", [json.dumps(detail), ip])
        stored_detail, stored_ip = cursor.fetchone()
    return json.loads(stored_detail), stored_ip


def _checkpoint_signature(*, seq: int, hash: str) -> str:
    if not settings.AUDIT_CHECKPOINT_KEY:
        raise ImproperlyConfigured("AUDIT_CHECKPOINT_KEY is needed to sign or check audit checkpoints")
    message = f"{seq}:{hash}".encode()
    return hmac.new(settings.AUDIT_CHECKPOINT_KEY.encode(), message, hashlib.sha256).hexdigest()


def _unsigned(checkpoint: AuditCheckpoint) -> ChainBreak | None:
    """A break at the checkpoint, unless it carries this platform's signature."""
    if hmac.compare_digest(
        checkpoint.signature, _checkpoint_signature(seq=checkpoint.seq, hash=checkpoint.hash)
    ):
        return None
    reason = _("the checkpoint at event #%(seq)d is not signed with this platform's key")
    return ChainBreak(checkpoint.seq, reason % {"seq": checkpoint.seq})


def audit_prune(*, now: datetime | None = None) -> int:
    """Delete the events older than AUDIT_RETENTION_DAYS, leaving a signed checkpoint in their place.

    Only a prefix of the chain goes (up to the first event still kept), so what stays verifies from
    the checkpoint. Returns how many events went.
    """
    if not settings.AUDIT_RETENTION_DAYS:
        return 0
    cutoff = (now or timezone.now()) - timedelta(days=settings.AUDIT_RETENTION_DAYS)
    with transaction.atomic():
        head = _locked_head()
        first_kept = AuditEvent.objects.filter(at__gte=cutoff).aggregate(seq=Min("seq"))["seq"]
        last = AuditEvent.objects.filter(seq__lte=head.seq if first_kept is None else first_kept - 1)
        last = last.order_by("-seq").first()
        if last is None:
            return 0
        # The trigger lets DELETE through only for events a checkpoint covers: write it first.
        AuditCheckpoint.objects.create(
            seq=last.seq, hash=last.hash, signature=_checkpoint_signature(seq=last.seq, hash=last.hash)
        )
        pruned = AuditEvent.objects.filter(seq__lte=last.seq).delete()[0]
        audit_record(actor=SYSTEM, action="audit.pruned", through=last.seq, events=pruned)
    return pruned


@dataclass(frozen=True)
class ChainBreak:
    seq: int
    reason: str


@dataclass(frozen=True)
class ExportedHead:
    """A line of AUDIT_HEAD_LOG: where the chain's head was when exported, signed under the chain's key."""

    seq: int
    hash: str
    at: str
    mac: str

    def signed(self) -> bool:
        return hmac.compare_digest(self.mac, _keyed(HEAD_SALT, f"{self.seq}:{self.hash}:{self.at}"))


@dataclass(frozen=True)
class ChainReport:
    checked: int
    broken: ChainBreak | None
    # The newest head exported outside the database, once the chain was checked against it.
    exported: ExportedHead | None = None


def audit_head_export() -> bool:
    """Append the chain's head to AUDIT_HEAD_LOG if it moved since the last line; True if a line was written.

    The copy lies where the database's role cannot reach, so that cutting the chain's newest events and
    moving the head back shows at the next verification. A head that no longer contains the last one
    exported is never written: that would bless the cut.
    """
    if not settings.AUDIT_HEAD_LOG:
        return False
    path = Path(settings.AUDIT_HEAD_LOG)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "r+b") as file:
        fcntl.flock(file, fcntl.LOCK_EX)  # one exporter at a time reads the last line and appends
        head = AuditChainHead.objects.filter(pk=1).first()
        if head is None or head.seq == 0:
            return False
        last = _last_exported(file)
        if last is not None and (last.seq, last.hash) == (head.seq, head.hash):
            return False
        broken = _exported_break(last, head) if last is not None else None
        if broken is not None:
            log.error("audit head not exported: %s", broken.reason)
            return False
        at = timezone.now().isoformat(timespec="seconds")
        line = {"seq": head.seq, "hash": head.hash, "at": at}
        line["mac"] = _keyed(HEAD_SALT, f"{head.seq}:{head.hash}:{at}")
        file.write(json.dumps(line).encode() + b"\n")
        file.flush()
        os.fsync(file.fileno())
    return True


def _last_exported(file) -> ExportedHead | None:
    """The log's last line (its tail alone is read); a line that is not a head reads as an unsigned one."""
    size = file.seek(0, os.SEEK_END)
    file.seek(max(0, size - 4096))
    lines = file.read().splitlines()
    if not lines:
        return None
    try:
        fields = json.loads(lines[-1])
        return ExportedHead(seq=int(fields["seq"]), hash=fields["hash"], at=fields["at"], mac=fields["mac"])
    except (ValueError, KeyError, TypeError):
        return ExportedHead(seq=0, hash="", at="", mac="")


def _exported_break(exported: ExportedHead, head: AuditChainHead) -> ChainBreak | None:
    """Whether the chain still holds the exported head: not cut after it, not written again from below it."""
    if not exported.signed():
        reason = _("the last head in %(log)s is not signed with this platform's key")
        return ChainBreak(exported.seq, reason % {"log": settings.AUDIT_HEAD_LOG})
    facts = {"first": head.seq + 1, "last": exported.seq, "at": exported.at}
    if exported.seq > head.seq:
        reason = _(
            "events #%(first)d to #%(last)d were cut: the head exported at %(at)s was at #%(last)d "
            "(or the database was restored from a backup older than that)"
        )
        return ChainBreak(head.seq + 1, reason % facts)
    # Pruned since, the exported event is vouched for by the first checkpoint at or after it, if signed.
    covering = AuditCheckpoint.objects.filter(seq__gte=exported.seq).order_by("seq").first()
    if covering is not None:
        if (unsigned := _unsigned(covering)) is not None or covering.seq > exported.seq:
            return unsigned
        there = covering.hash
    else:
        there = AuditEvent.objects.filter(seq=exported.seq).values_list("hash", flat=True).first()
    if there != exported.hash:
        reason = _(
            "event #%(last)d is not the one exported at %(at)s: the chain was cut there and written again"
        )
        return ChainBreak(exported.seq, reason % facts)
    return None


def _exported_head() -> ExportedHead | None:
    if not settings.AUDIT_HEAD_LOG:
        return None
    try:
        with open(settings.AUDIT_HEAD_LOG, "rb") as file:
            return _last_exported(file)
    except FileNotFoundError:
        return None


def audit_chain_verify() -> ChainReport:
    """Walk the chain from its latest checkpoint (or its start) to its head, then hold it against the head
    last exported outside the database; the first broken link."""
    # The exported head first, then the chain's: whatever is appended meanwhile lies beyond both.
    exported = _exported_head()
    head = AuditChainHead.objects.filter(pk=1).first()
    checkpoint = AuditCheckpoint.objects.order_by("-seq").first()
    seq, hash = 0, ""
    if checkpoint is not None:
        if (unsigned := _unsigned(checkpoint)) is not None:
            return ChainReport(0, unsigned)
        seq, hash = checkpoint.seq, checkpoint.hash
    if head is None:
        if checkpoint is not None or exported is not None or AuditEvent.objects.exists():
            return ChainReport(0, ChainBreak(seq + 1, _("the chain's head is missing")))
        return ChainReport(0, None)
    checked = 0
    events = AuditEvent.objects.filter(seq__gt=seq, seq__lte=head.seq).order_by("seq")
    for event in events.iterator(chunk_size=2000):
        if event.seq != seq + 1:
            reason = _("events #%(first)d to #%(last)d are missing") % {
                "first": seq + 1,
                "last": event.seq - 1,
            }
            return ChainReport(checked, ChainBreak(seq + 1, reason))
        if event.prev_hash != hash:
            reason = _("event #%(seq)d (%(id)s) does not follow the event before it")
            return ChainReport(checked, ChainBreak(event.seq, reason % {"seq": event.seq, "id": event.id}))
        if event_digest(event) != event.hash:
            reason = _("event #%(seq)d (%(id)s) was altered after it was written")
            return ChainReport(checked, ChainBreak(event.seq, reason % {"seq": event.seq, "id": event.id}))
        seq, hash = event.seq, event.hash
        checked += 1
    if seq != head.seq:
        reason = _("events #%(first)d to #%(last)d are missing") % {"first": seq + 1, "last": head.seq}
        return ChainReport(checked, ChainBreak(seq + 1, reason))
    if hash != head.hash:
        reason = _("event #%(seq)d is not the one the chain's head records") % {"seq": seq}
        return ChainReport(checked, ChainBreak(seq, reason))
    if exported is None:
        return ChainReport(checked, None)
    return ChainReport(checked, _exported_break(exported, head), exported)
