"""Who acts, and the append-only record of what they did."""

from __future__ import annotations

from dataclasses import dataclass

from desktops.middleware import current_request
from desktops.models import ApiKey, AuditEvent


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

    @classmethod
    def from_request(cls, request) -> Actor:
        api_key = request.auth if isinstance(getattr(request, "auth", None), ApiKey) else None
        user = request.user if request.user.is_authenticated else None
        return cls(user=user, api_key=api_key, system="" if user else "anonymous")


SYSTEM = Actor(system="worker")


def audit_record(
    *, actor: Actor, action: str, workspace_id: str = "", target: str = "", **detail
) -> AuditEvent:
    """Write one audit event; callers pass ids and facts, never secrets."""
    context = current_request.get()
    return AuditEvent.objects.create(
        actor=actor.label,
        workspace_id=workspace_id,
        action=action,
        target=target,
        ip=context.ip,
        request_id=context.request_id,
        detail=detail,
    )
