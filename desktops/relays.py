"""Who may open which relay (a desktop's screen or terminal), once, and for how long.

The API mints one ticket per relay; only its hash is kept. A ticket opens exactly one relay (a
conditional UPDATE claims it), within RELAY_TOKEN_MAX_AGE, from what minted it: the same browser
session, or an API key that is still valid. An open relay is checked again whenever access may have
changed, and counts towards its user's cap of open relays while it reports itself alive.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone
from django.utils.translation import gettext as _

from desktops.audit import Actor, audit_record
from desktops.events import WatchersChanged, publish_watchers_change
from desktops.models import ApiKey, Desktop, DesktopState, RelayTicket, Role
from desktops.selectors import desktop_get, role_in, workspace_for_control

Mode = RelayTicket.Mode
Kind = RelayTicket.Kind
# A relay reports itself alive this often; one silent for three times as long no longer counts.
HEARTBEAT_SECONDS = 30


class RelayDenied(Exception):
    """Why a relay refuses or ends a session: a WebSocket close code and words for a person."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


# Close codes: 4400 protocol misuse, 4401 ticket missing/bad/used/expired, 4403 no (longer) access,
# 4409 desktop not running, 4429 too many open relays, 4502 the desktop's service is not answering,
# 4503 the engine's console (the VNC relay's fallback) refused the relay.


@dataclass(frozen=True)
class RelayTickets:
    vnc: str
    terminal: str
    mode: str
    expires_at: datetime


@dataclass(frozen=True)
class RelayGrant:
    ticket_id: str
    user_id: int
    desktop_id: str
    mode: str
    api_key_id: str | None


def secret_hash(value: str) -> str:
    return hashlib.sha256(value.encode()).hexdigest()


def control_role(workspace) -> Role:
    return Role(workspace.control_role)


def needed_role(desktop: Desktop, mode: str) -> Role:
    return Role.VIEWER if mode == Mode.VIEW else control_role(desktop.workspace)


def relay_tickets_mint(*, actor: Actor, desktop_id: str, mode: str, session_key: str = "") -> RelayTickets:
    """A ticket for the screen and one for the terminal, for this actor, in this mode."""
    desktop = desktop_get(actor=actor, desktop_id=desktop_id)
    if mode == Mode.CONTROL:
        workspace_for_control(actor=actor, workspace_id=desktop.workspace_id)
    session_hash = "" if actor.api_key else secret_hash(session_key)
    taking_control = mode == Mode.CONTROL and not _had_control(actor, desktop, session_hash)
    expires_at = timezone.now() + timedelta(seconds=settings.RELAY_TOKEN_MAX_AGE)
    secrets_by_kind = {}
    for kind in Kind:
        secret = secrets.token_urlsafe(32)
        RelayTicket.objects.create(
            ticket_hash=secret_hash(secret),
            kind=kind,
            mode=mode,
            user=actor.user,
            desktop=desktop,
            api_key=actor.api_key,
            # A session-minted ticket only opens from that session; a key-minted one needs the key valid.
            session_hash=session_hash,
            expires_at=expires_at,
        )
        secrets_by_kind[kind] = secret
    if taking_control:
        audit_record(
            actor=actor, action="desktop.control_taken", workspace_id=desktop.workspace_id, target=desktop.id
        )
    return RelayTickets(secrets_by_kind[Kind.VNC], secrets_by_kind[Kind.TERMINAL], mode, expires_at)


# A viewer that reconnects in control mode within this long is still in control: not a new taking.
CONTROL_KEPT = timedelta(hours=1)


def _had_control(actor: Actor, desktop: Desktop, session_hash: str) -> bool:
    """Whether this browser session (or API key) was in control of the desktop already: its tickets are
    minted anew on each reconnection and mode switch, but only taking control is an act worth auditing
    (watching, and the reconnections a page makes by itself, are not)."""
    last = (
        RelayTicket.objects.filter(
            desktop=desktop, user=actor.user, api_key=actor.api_key, session_hash=session_hash
        )
        .order_by("-created_at")
        .values("mode", "created_at")
        .first()
    )
    return bool(last) and last["mode"] == Mode.CONTROL and last["created_at"] > timezone.now() - CONTROL_KEPT


def relay_ticket_claim(
    *, ticket: str, desktop_id: str, kind: str, session_key: str
) -> tuple[RelayGrant, str]:
    """Open a relay with a ticket: the grant and the desktop's address, or RelayDenied."""
    if not ticket:
        raise RelayDenied(4401, _("A relay ticket is required."))
    now = timezone.now()
    found = RelayTicket.objects.filter(ticket_hash=secret_hash(ticket)).first()
    if found is None or found.desktop_id != desktop_id or found.kind != kind:
        raise RelayDenied(4401, _("This relay ticket is not valid here."))
    if found.session_hash and found.session_hash != secret_hash(session_key):
        raise RelayDenied(4401, _("This relay ticket belongs to another session."))
    # Claimed at most once: of two relays presenting it, one changes the row and the other is refused.
    claimed = RelayTicket.objects.filter(id=found.id, opened_at__isnull=True, expires_at__gt=now).update(
        opened_at=now, seen_at=now
    )
    if not claimed:
        raise RelayDenied(
            4401, _("This relay ticket was used already or has expired; open the desktop again.")
        )
    grant = RelayGrant(found.id, found.user_id, desktop_id, found.mode, found.api_key_id)
    _watchers_changed(desktop_id)
    try:
        host = relay_grant_recheck(grant)
        if _open_relays(grant) > settings.RELAY_MAX_PER_USER:
            raise RelayDenied(
                4429,
                _("You have %(count)s relays open already: close a screen or terminal first.")
                % {"count": settings.RELAY_MAX_PER_USER},
            )
    except RelayDenied:
        relay_closed(grant)
        raise
    return grant, host


def relay_grant_recheck(grant: RelayGrant) -> str:
    """Check a grant against the present: its ticket was not ended, the user, key and role still allow
    it, the desktop still runs."""
    user = get_user_model().objects.filter(pk=grant.user_id, is_active=True).first()
    desktop = Desktop.objects.select_related("workspace").filter(id=grant.desktop_id).first()
    api_key = None
    if grant.api_key_id:
        api_key = ApiKey.objects.filter(id=grant.api_key_id).first()
        if api_key is None or not api_key.usable():
            raise RelayDenied(4403, _("The API key that opened this relay is no longer valid."))
    if not RelayTicket.objects.filter(id=grant.ticket_id, closed_at__isnull=True).exists():
        raise RelayDenied(
            4403, _("This relay was ended by a change to your account: open the desktop again.")
        )
    role = (
        role_in(actor=Actor(user=user, api_key=api_key), workspace_id=desktop.workspace_id)
        if user and desktop
        else None
    )
    if role is None or role.rank < needed_role(desktop, grant.mode).rank:
        raise RelayDenied(4403, _("You no longer have access to this desktop."))
    if desktop.state != DesktopState.RUNNING or not desktop.private_ip:
        raise RelayDenied(
            4409, _("The desktop is %(state)s, not running.") % {"state": desktop.get_state_display()}
        )
    return desktop.private_ip


def relays_end_for_new_password(*, user_id: int) -> None:
    """End the relays (and unused tickets) that a user's browser sessions opened; those of an API key go
    on, as the key does. Each open relay finds out on its next check (an access change makes it now)."""
    ended = RelayTicket.objects.filter(user_id=user_id, closed_at__isnull=True).exclude(session_hash="")
    desktop_ids = set(ended.values_list("desktop_id", flat=True))
    ended.update(closed_at=timezone.now())
    for desktop_id in desktop_ids:
        _watchers_changed(desktop_id)


def relay_seen(grant: RelayGrant) -> None:
    RelayTicket.objects.filter(id=grant.ticket_id, closed_at__isnull=True).update(seen_at=timezone.now())


def relay_closed(grant: RelayGrant) -> None:
    open_relay = RelayTicket.objects.filter(id=grant.ticket_id, closed_at__isnull=True)
    if open_relay.update(closed_at=timezone.now()):
        _watchers_changed(grant.desktop_id)


def _open_relays(grant: RelayGrant) -> int:
    return _alive_relays().filter(user_id=grant.user_id).count()


def _alive_relays():
    """The relays open now: claimed, not closed, and heard from lately (a dead process's stop counting)."""
    alive = timezone.now() - timedelta(seconds=3 * HEARTBEAT_SECONDS)
    return RelayTicket.objects.filter(opened_at__isnull=False, closed_at__isnull=True, seen_at__gt=alive)


@dataclass(frozen=True)
class Watcher:
    user_id: int
    email: str
    controls: bool


def desktop_watchers(*, desktop: Desktop) -> list[Watcher]:
    """Who has the desktop's screen or terminal open now, and which of them have control."""
    watchers: dict[int, Watcher] = {}
    rows = _alive_relays().filter(desktop=desktop).values_list("user_id", "user__email", "mode")
    for user_id, email, mode in rows.order_by("user__email"):
        controls = mode == Mode.CONTROL or (user_id in watchers and watchers[user_id].controls)
        watchers[user_id] = Watcher(user_id, email, controls)
    return list(watchers.values())


def _watchers_changed(desktop_id: str) -> None:
    workspace_id = Desktop.objects.filter(id=desktop_id).values_list("workspace_id", flat=True).first()
    if workspace_id:
        publish_watchers_change(WatchersChanged(desktop_id=desktop_id, workspace_id=workspace_id))
