"""Reads, always scoped to what the actor may see: an outsider gets "not found", never a hint."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from allauth.account.models import EmailAddress
from django.conf import settings
from django.core import signing
from django.db.models import Count, Exists, F, OuterRef, Q, QuerySet, Subquery, Value
from django.db.models.functions import Concat, Substr
from django.utils.translation import gettext as _

from desktops.audit import Actor
from desktops.errors import Forbidden, Invalid, NotFound
from desktops.models import (
    DEFAULT_AGENT_COMMAND,
    MINIMAL_PROFILE,
    ApiKey,
    ApiScope,
    AuditEvent,
    ChatMessage,
    Desktop,
    DesktopEvent,
    DesktopLabel,
    DesktopState,
    Invitation,
    LLMKey,
    Membership,
    Plan,
    Role,
    Schedule,
    ScheduleRun,
    Workspace,
)


def role_in(*, actor: Actor, workspace_id: str) -> Role | None:
    """The actor's effective role: a key never exceeds its creator, and a read key only reads."""
    user = actor.user
    if user is None or not user.is_authenticated:
        return None
    if actor.support and user.is_staff:
        return Role.OWNER
    if actor.api_key is not None and actor.api_key.workspace_id != workspace_id:
        return None
    role = (
        Membership.objects.filter(workspace_id=workspace_id, user=user).values_list("role", flat=True).first()
    )
    if role is None:
        return None
    if actor.api_key is not None and actor.api_key.scope == ApiScope.READ:
        return Role.VIEWER
    return Role(role)


def workspaces_visible(*, actor: Actor) -> QuerySet[Workspace]:
    if actor.user is None or not actor.user.is_authenticated:
        return Workspace.objects.none()
    workspaces = Workspace.objects.filter(memberships__user=actor.user)
    if actor.api_key is not None:
        workspaces = workspaces.filter(id=actor.api_key.workspace_id)
    return workspaces.order_by("created_at")


def workspace_get(*, actor: Actor, workspace_id: str, minimum: Role = Role.VIEWER) -> Workspace:
    role = role_in(actor=actor, workspace_id=workspace_id)
    if role is None:
        raise NotFound(f"Workspace {workspace_id} not found.")
    if role.rank < minimum.rank:
        raise Forbidden(f"This needs the {minimum} role in the workspace; you are {role}.")
    workspace = Workspace.objects.get(id=workspace_id)
    workspace.role = role  # the actor's, found on the way: callers need not ask again
    return workspace


def workspace_for_control(*, actor: Actor, workspace_id: str) -> Workspace:
    """The workspace, if the actor may take control of its desktops (screen, terminal, agent), which
    gives them what the desktops hold, the workspace's LLM keys included."""
    workspace = workspace_get(actor=actor, workspace_id=workspace_id)
    role, needed = workspace.role, Role(workspace.control_role)
    if role.rank < needed.rank:
        raise Forbidden(
            _("Taking control of this workspace's desktops needs the %(role)s role; you are %(yours)s.")
            % {"role": needed.label, "yours": role.label}
        )
    return workspace


def member_emails(*, workspace: Workspace, minimum: Role) -> list[str]:
    """The addresses of the workspace's active members of at least this role, to tell them something."""
    allowed = [role.value for role in Role if role.rank >= minimum.rank]
    members = workspace.memberships.filter(role__in=allowed, user__is_active=True).exclude(user__email="")
    return list(members.values_list("user__email", flat=True))


def workspace_default(*, actor: Actor) -> Workspace:
    """The workspace meant when none is named: the key's own, or the user's only one."""
    if actor.api_key is not None:
        return actor.api_key.workspace
    workspaces = list(workspaces_visible(actor=actor)[:2])
    if len(workspaces) != 1:
        why = "You belong to several workspaces" if workspaces else "You belong to no workspace"
        raise Invalid(f"{why}: give workspaceId.", fields={"workspaceId": ["This field is required."]})
    return workspaces[0]


def _addresses_of(user, **confirmed) -> list[str]:
    addresses = EmailAddress.objects.filter(user=user, **confirmed).values_list("email", flat=True)
    return [email.lower() for email in addresses]


def invitations_for(*, user) -> QuerySet[Invitation]:
    """The pending invitations to the user's confirmed addresses: only those can be answered."""
    pending = Invitation.objects.filter(accepted_at=None, declined_at=None)
    return (
        pending.filter(email__in=_addresses_of(user, verified=True))
        .select_related("workspace", "invited_by")
        .order_by("-created_at")
    )


def invitations_sent_since(*, workspace: Workspace, since: datetime) -> int:
    """How many invitations the workspace sent since then, sent again ones included (the trail keeps each)."""
    return AuditEvent.objects.filter(workspace_id=workspace.id, action="member.invite", at__gte=since).count()


def invitations_unconfirmed(*, user) -> list[str]:
    """The user's unconfirmed addresses that a pending invitation waits for: confirming one is what
    stands between them and its workspace. The invitations themselves stay hidden until then."""
    unconfirmed = _addresses_of(user, verified=False)
    pending = Invitation.objects.filter(accepted_at=None, declined_at=None, email__in=unconfirmed)
    return sorted(set(pending.values_list("email", flat=True)))


def invitations_pending(*, workspace: Workspace) -> QuerySet[Invitation]:
    return workspace.invitations.filter(accepted_at=None, declined_at=None).order_by("-created_at")


class InvitationState:
    """Where an invitation stands, as its workspace's admins see it."""

    SENT = "sent"  # its link not opened yet, as far as anyone can tell
    TO_CONFIRM = "to_confirm"  # opened by an account whose address is not confirmed yet
    TO_ACCEPT = "to_accept"  # opened from a confirmed address: theirs to accept
    DECLINED = "declined"


def invitation_list(*, workspace: Workspace) -> list[Invitation]:
    """The workspace's invitations not accepted (those are members now), each with its `state`.

    Whether the invitee has an account shows only once they opened the e-mailed link signed in:
    the list tells an admin nothing of who has an account before the invitee acts.
    """
    confirmed = EmailAddress.objects.filter(
        user=OuterRef("opened_by"), email__iexact=OuterRef("email"), verified=True
    )
    rows = list(
        workspace.invitations.filter(accepted_at=None)
        .annotate(opener_confirmed=Exists(confirmed))
        .select_related("invited_by")
        .order_by("-created_at")
    )
    for row in rows:
        if row.declined_at:
            row.state = InvitationState.DECLINED
        elif row.opened_by_id is None:
            row.state = InvitationState.SENT
        else:
            row.state = InvitationState.TO_ACCEPT if row.opener_confirmed else InvitationState.TO_CONFIRM
    return rows


# Invitation links carry the invitation's id signed with the site's key: only its e-mail holds one.
INVITATION_SALT = "lebureau.invitation"
# A link proves an address: one that leaks stops proving it after this (the admin sends it again).
INVITATION_VALID = timedelta(days=7)


def invitation_token(invitation: Invitation) -> str:
    return signing.dumps(invitation.id, salt=INVITATION_SALT)


def invitation_by_token(*, token: str) -> Invitation:
    """The pending invitation a link names; NotFound once withdrawn, answered or expired, or for a forged
    link."""
    try:
        invitation_id = signing.loads(token, salt=INVITATION_SALT, max_age=INVITATION_VALID)
    except signing.SignatureExpired as exc:
        raise NotFound(
            _("This invitation link has expired: ask for the invitation to be sent again.")
        ) from exc
    except signing.BadSignature as exc:
        raise NotFound(_("This invitation link is not valid.")) from exc
    found = (
        Invitation.objects.filter(id=invitation_id, accepted_at=None, declined_at=None)
        .select_related("workspace", "invited_by")
        .first()
    )
    if found is None:
        raise NotFound(_("This invitation was withdrawn or answered already."))
    return found


def membership_list(*, workspace: Workspace) -> QuerySet[Membership]:
    return workspace.memberships.select_related("user").order_by("created_at")


def plan_list() -> QuerySet[Plan]:
    return Plan.objects.filter(is_active=True)


def plan_get(*, plan: str | None) -> Plan:
    """A plan by id or name; the default plan when none is given."""
    wanted = plan or settings.DEFAULT_PLAN
    found = plan_list().filter(id=wanted).first() or plan_list().filter(name=wanted).first()
    if found is None:
        names = ", ".join(plan_list().values_list("name", flat=True))
        raise Invalid(f"Unknown plan {wanted!r}; choose one of: {names}.", fields={"plan": ["Unknown plan."]})
    return found


def desktop_list(
    *,
    actor: Actor,
    workspace_id: str | None = None,
    state: str | None = None,
    labels: list[str] | None = None,
    name: str | None = None,
) -> QuerySet[Desktop]:
    desktops = Desktop.objects.filter(workspace__in=workspaces_visible(actor=actor))
    # The plan's price too: the API shows it on every desktop.
    desktops = desktops.select_related("plan__price").prefetch_related("labels")
    if workspace_id:
        desktops = desktops.filter(workspace_id=workspace_id)
    for label in labels or ():  # every one of them
        desktops = desktops.filter(labels__name=label)
    if name:
        desktops = desktops.filter(name=name)
    # Destroyed desktops are history: shown only when asked for by state.
    return desktops.filter(state=state) if state else desktops.exclude(state=DesktopState.DESTROYED)


def _scoped_get(queryset: QuerySet, object_id: str, *, actor: Actor, minimum: Role, label: str):
    """An object of some workspace, as "not found" to anyone outside that workspace."""
    found = queryset.filter(id=object_id).first()
    if found is None or role_in(actor=actor, workspace_id=found.workspace_id) is None:
        raise NotFound(f"{label} {object_id} not found.")
    workspace_get(actor=actor, workspace_id=found.workspace_id, minimum=minimum)
    return found


def desktop_get(*, actor: Actor, desktop_id: str, minimum: Role = Role.VIEWER) -> Desktop:
    queryset = Desktop.objects.select_related("plan", "workspace").prefetch_related("labels")
    return _scoped_get(queryset, desktop_id, actor=actor, minimum=minimum, label="Desktop")


def desktop_events(*, desktop: Desktop) -> QuerySet[DesktopEvent]:
    return desktop.events.order_by("created_at")


def agent_key_missing(*, desktop: Desktop) -> bool:
    """Whether the desktop's agent is the platform's own (in an image that has it) while its workspace holds
    no model key: a turn could only fail, so the person is told at once what to do instead."""
    return (
        desktop.workspace.agent_command == DEFAULT_AGENT_COMMAND
        and desktop.image_profile != MINIMAL_PROFILE
        and not LLMKey.objects.filter(workspace_id=desktop.workspace_id).exists()
    )


def desktop_destruction(*, desktop: Desktop) -> DesktopEvent | None:
    """The step that started a destroyed desktop's destruction: who asked for it (its actor), and when."""
    return desktop.events.filter(to_state=DesktopState.DESTROYING).order_by("-created_at").first()


def api_key_list(*, actor: Actor, workspace_id: str | None = None) -> QuerySet[ApiKey]:
    keys = ApiKey.objects.filter(workspace__in=_managed_workspaces(actor), revoked_at__isnull=True)
    return keys.filter(workspace_id=workspace_id) if workspace_id else keys.select_related("created_by")


def api_key_get(*, actor: Actor, key_id: str) -> ApiKey:
    queryset = ApiKey.objects.filter(revoked_at__isnull=True)
    return _scoped_get(queryset, key_id, actor=actor, minimum=Role.ADMIN, label="API key")


def llm_key_list(*, actor: Actor, workspace_id: str | None = None) -> QuerySet[LLMKey]:
    keys = LLMKey.objects.filter(workspace__in=_managed_workspaces(actor))
    return keys.filter(workspace_id=workspace_id) if workspace_id else keys


def llm_key_get(*, actor: Actor, key_id: str) -> LLMKey:
    return _scoped_get(LLMKey.objects.all(), key_id, actor=actor, minimum=Role.ADMIN, label="LLM key")


def _managed_workspaces(actor: Actor) -> list[str]:
    """Workspaces where the actor may manage keys (admins and owners)."""
    return [
        workspace.id
        for workspace in workspaces_visible(actor=actor)
        if (role := role_in(actor=actor, workspace_id=workspace.id)) and role.rank >= Role.ADMIN.rank
    ]


def audit_list(
    *,
    workspace: Workspace,
    actor: str = "",
    action: str = "",
    target: str = "",
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEvent]:
    events = AuditEvent.objects.filter(workspace_id=workspace.id)
    if actor:
        events = events.filter(actor__icontains=actor)
    if action:
        events = events.filter(action__startswith=action)
    if target := target.strip():
        # An id, or (part of) the name of something of this workspace's: a desktop, a member's address, a
        # key's name… including what is gone since and named in its last event.
        named = Q(target=target) | Q(detail__name__icontains=target) | Q(detail__email__icontains=target)
        for rows in _audit_targets(workspace.id):
            named |= Q(target__in=rows.filter(shown__icontains=target).values("id"))
        events = events.filter(named)
    if since:
        events = events.filter(at__gte=since)
    if until:
        events = events.filter(at__lt=until)
    return events


def _audit_targets(workspace_id: str) -> list[QuerySet]:
    """What audit events name as their target, with what people call each (`shown`): the workspace's own
    rows only, so no filter or page can name another workspace's."""
    return [
        Workspace.objects.filter(id=workspace_id).annotate(shown=F("name")),
        Desktop.objects.filter(workspace_id=workspace_id).annotate(shown=F("name")),
        Membership.objects.filter(workspace_id=workspace_id).annotate(shown=F("user__email")),
        Invitation.objects.filter(workspace_id=workspace_id).annotate(shown=F("email")),
        ApiKey.objects.filter(workspace_id=workspace_id).annotate(shown=F("name")),
        LLMKey.objects.filter(workspace_id=workspace_id).annotate(shown=F("name")),
        Schedule.objects.filter(desktop__workspace_id=workspace_id).annotate(
            shown=Concat("desktop__name", Value(" · "), "cron")
        ),
    ]


def audit_target_names(*, workspace: Workspace, events: list[AuditEvent]) -> dict[str, str]:
    """What people call these events' targets (and the API keys they acted with), by id: the
    workspace's desktops, members, invitations, keys and schedules as they are now, else the name the
    event itself recorded (a removed member's address, a deleted key's name)."""
    ids = {event.target for event in events if event.target}
    ids |= {key[0] for event in events if (key := Actor.key_of(event.actor))}  # who acted with a key
    names = {}
    for event in events:
        recorded = event.detail.get("name") or event.detail.get("email")
        if event.target and isinstance(recorded, str):
            names[event.target] = recorded
    for rows in _audit_targets(workspace.id):
        names.update(rows.filter(id__in=ids).values_list("id", "shown"))
    return names


def chat_list(*, desktop: Desktop) -> QuerySet[ChatMessage]:
    return desktop.messages.order_by("created_at").select_related("desktop").prefetch_related("chunks")


def chat_message_get(*, desktop: Desktop, message_id: str) -> ChatMessage:
    """One message of the desktop's conversation: what a client polls while an answer grows."""
    message = chat_list(desktop=desktop).filter(id=message_id).first()
    if message is None:
        raise NotFound(_("Message %(id)s not found.") % {"id": message_id})
    return message


def chat_content(message: ChatMessage) -> str:
    """A message's text: whole once its turn has ended, its pieces so far while it streams in."""
    return message.content + "".join(chunk.text for chunk in message.chunks.all())


WORKING = [ChatMessage.Status.QUEUED, ChatMessage.Status.RUNNING]
# Of desktops with their outcome: the engine failed them, or their agent's last turn failed.
FAILING = Q(state=DesktopState.ERROR) | Q(outcome=ChatMessage.Status.ERROR)


def desktops_with_outcome(desktops: QuerySet[Desktop]) -> QuerySet[Desktop]:
    """The desktops, each with its agent's last turn in the same query: `outcome` (its status, None
    before any), `outcome_task` (what it was asked), `outcome_detail` (the answer or why it failed),
    `outcome_at` (when it ended)."""
    last = ChatMessage.objects.filter(desktop_id=OuterRef("pk"), author=ChatMessage.Author.AGENT)
    last = last.order_by("-created_at")
    return desktops.annotate(
        outcome=Subquery(last.values("status")[:1]),
        outcome_task=Subquery(last.values(task=Substr("reply_to__content", 1, 300))[:1]),
        outcome_detail=Subquery(last.values(detail=Substr("content", 1, 300))[:1]),
        outcome_at=Subquery(last.values("completed_at")[:1]),
    )


@dataclass(frozen=True)
class FleetSummary:
    desktops: int
    running: int
    stopped: int
    suspended: int
    in_error: int
    working: int


def fleet_summary(*, workspace: Workspace) -> FleetSummary:
    """How the workspace's fleet is doing, in one query: in error counts a desktop the engine failed
    and one whose agent's last turn failed."""
    live = desktops_with_outcome(workspace.desktops.exclude(state=DesktopState.DESTROYED))
    return FleetSummary(
        **live.aggregate(
            desktops=Count("id"),
            running=Count("id", filter=Q(state=DesktopState.RUNNING)),
            stopped=Count("id", filter=Q(state=DesktopState.STOPPED)),
            suspended=Count("id", filter=Q(state=DesktopState.SUSPENDED)),
            in_error=Count("id", filter=FAILING),
            working=Count("id", filter=Q(outcome__in=WORKING)),
        )
    )


def desktop_ids_running(*, workspace_id: str) -> list[str]:
    """The workspace's running desktops, for work done on the system's behalf (no actor to scope by)."""
    return list(
        Desktop.objects.filter(workspace_id=workspace_id, state=DesktopState.RUNNING).values_list(
            "id", flat=True
        )
    )


def label_list(*, workspace: Workspace) -> QuerySet[DesktopLabel]:
    """The labels in use on the workspace's live desktops, each with how many desktops have it."""
    labels = DesktopLabel.objects.filter(desktop__workspace=workspace)
    labels = labels.exclude(desktop__state=DesktopState.DESTROYED)
    return labels.values("name").annotate(desktops=Count("desktop_id")).order_by("name")


def schedule_list(*, desktop: Desktop) -> QuerySet[Schedule]:
    return desktop.schedules.select_related("created_by").order_by("created_at")


def schedule_get(*, actor: Actor, schedule_id: str) -> Schedule:
    """A schedule, seen by whoever sees its desktop."""
    schedules = Schedule.objects.select_related("desktop__workspace", "created_by")
    schedules = schedules.annotate(workspace_id=F("desktop__workspace_id"))
    return _scoped_get(schedules, schedule_id, actor=actor, minimum=Role.VIEWER, label=_("Schedule"))


def schedule_last_runs(*, schedule_ids: list[str]) -> dict[str, ScheduleRun]:
    """Each schedule's latest run, by schedule."""
    runs = ScheduleRun.objects.filter(schedule_id__in=schedule_ids).order_by("schedule_id", "-created_at")
    return {run.schedule_id: run for run in runs.distinct("schedule_id")}


def schedule_runs(*, schedule: Schedule) -> QuerySet[ScheduleRun]:
    return schedule.runs.order_by("-created_at")
