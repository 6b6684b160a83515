"""Relay session tokens: short-lived, signed, for one user, one desktop and one mode."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core import signing
from django.utils import timezone

from desktops.audit import Actor, audit_record
from desktops.models import Desktop, DesktopState, Role
from desktops.selectors import desktop_get, role_in

SALT = "lebureau.relay"


class Mode(StrEnum):
    VIEW = "view"
    CONTROL = "control"


NEEDS = {Mode.VIEW: Role.VIEWER, Mode.CONTROL: Role.MEMBER}


class RelayDenied(Exception):
    """Why a relay refuses or ends a session: a WebSocket close code and words for a person."""

    def __init__(self, code: int, reason: str):
        super().__init__(reason)
        self.code = code
        self.reason = reason


# Close codes: 4400 protocol misuse, 4401 token missing/bad/expired, 4403 no (longer) access,
# 4409 desktop not running, 4502 the desktop's service is not answering, 4503 the engine's console
# (the VNC relay's fallback) refused the relay.
NO_TOKEN = RelayDenied(4401, "A session token is required.")


@dataclass(frozen=True)
class RelayGrant:
    user_id: int
    desktop_id: str
    mode: Mode


@dataclass(frozen=True)
class RelaySession:
    token: str
    mode: Mode
    expires_at: datetime


def relay_session_create(*, actor: Actor, desktop_id: str, mode: str) -> RelaySession:
    mode = Mode(mode)
    desktop = desktop_get(actor=actor, desktop_id=desktop_id, minimum=NEEDS[mode])
    token = signing.dumps({"u": actor.user.pk, "d": desktop.id, "m": mode}, salt=SALT, compress=True)
    audit_record(
        actor=actor, action="relay.session", workspace_id=desktop.workspace_id, target=desktop.id, mode=mode
    )
    return RelaySession(token, mode, timezone.now() + timedelta(seconds=settings.RELAY_TOKEN_MAX_AGE))


def relay_grant_check(*, token: str, desktop_id: str) -> tuple[RelayGrant, str]:
    """The grant a token carries and the desktop's address, or RelayDenied."""
    if not token:
        raise NO_TOKEN
    try:
        data = signing.loads(token, salt=SALT, max_age=settings.RELAY_TOKEN_MAX_AGE)
    except signing.SignatureExpired as exc:
        raise RelayDenied(4401, "The session token has expired; open the desktop again.") from exc
    except signing.BadSignature as exc:
        raise RelayDenied(4401, "The session token is not valid.") from exc
    if data["d"] != desktop_id:
        raise RelayDenied(4403, "This session token is for another desktop.")
    grant = RelayGrant(user_id=data["u"], desktop_id=data["d"], mode=Mode(data["m"]))
    return grant, relay_grant_recheck(grant)


def relay_grant_recheck(grant: RelayGrant) -> str:
    """Check a grant against the present: the user still has the role, the desktop still runs."""
    user = get_user_model().objects.filter(pk=grant.user_id, is_active=True).first()
    desktop = Desktop.objects.filter(id=grant.desktop_id).first()
    role = role_in(actor=Actor(user=user), workspace_id=desktop.workspace_id) if user and desktop else None
    if role is None or role.rank < NEEDS[grant.mode].rank:
        raise RelayDenied(4403, "You no longer have access to this desktop.")
    if desktop.state != DesktopState.RUNNING or not desktop.private_ip:
        raise RelayDenied(4409, f"The desktop is {desktop.state}, not running.")
    return desktop.private_ip
