"""Approvals: an agent, from inside its desktop, asks its operators before doing something sensitive,
and waits for their decision.

The request comes through the guest endpoint, on the desktop's own token; people answer it from
Mission Control or the API, if the workspace's policy gives them the role to (`approval_role`). An
approval is bound to exactly what was asked (a digest of the desktop, title, details and working
directory, which the desktop computes too): the decision says which request it answers. Nobody
deciding in time refuses it (`expired`). Each step is audited: who asked, who decided, when, and why.
"""

from __future__ import annotations

import hashlib
import json
import unicodedata
from datetime import timedelta

from django.conf import settings
from django.core.mail import send_mass_mail
from django.db import transaction
from django.db.models import Count, Exists, OuterRef, QuerySet
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _

from desktops.audit import SYSTEM, Actor, audit_record, desktop_actor
from desktops.crypto import api_token_hash
from desktops.errors import Conflict, Forbidden, Invalid, NotFound, Unavailable
from desktops.events import ApprovalChanged, publish_approval_change
from desktops.models import Approval, ApprovalScreenshot, ChatMessage, Desktop, DesktopState, Role, Workspace
from desktops.queue import APPROVAL_EMAIL, APPROVAL_SCREENSHOT, WORKSPACE_AGENT_CONFIGURE, enqueue
from desktops.screen import ScreenshotOptions, screen_screenshot
from desktops.selectors import member_emails, role_in, workspace_get, workspaces_visible
from desktops.webhooks import webhook_notify

Status = Approval.Status
MAX_TITLE = 200
MAX_DETAILS = 64 * 1024
MAX_CWD = 1000
MAX_COMMENT = 2000
# The longest a request may wait, whatever the agent asks: a day.
MAX_TIMEOUT = 24 * 3600
# Requests one desktop may have waiting at once: a runaway agent cannot flood its operators.
MAX_PENDING = 20
# The policy's command patterns ("git push"): how many, and how long each.
MAX_COMMAND_PATTERNS = 50
MAX_COMMAND_PATTERN = 100


def approval_policy_set(
    *,
    actor: Actor,
    workspace_id: str,
    role: str | None = None,
    timeout: int | None = None,
    commands: list[str] | None = None,
) -> Workspace:
    """Who may answer the workspace's requests for approval, how long a request waits by default, and
    which commands the agents run only once approved (pushed to the desktops' agent runtime)."""
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    if commands is not None:
        workspace.approval_commands = _command_patterns(commands)
    if role is not None:
        if role not in (Role.MEMBER, Role.ADMIN, Role.OWNER):
            message = _("Approvals go to members, admins or owners.")
            raise Invalid(message, fields={"approvalRole": [message]})
        workspace.approval_role = role
    if timeout is not None:
        if not 10 <= timeout <= MAX_TIMEOUT:
            message = _("A request waits 10 to %(n)s seconds.") % {"n": MAX_TIMEOUT}
            raise Invalid(message, fields={"approvalTimeout": [message]})
        workspace.approval_timeout = timeout
    workspace.save(update_fields=["approval_role", "approval_timeout", "approval_commands"])
    audit_record(
        actor=actor,
        action="workspace.approval_policy",
        workspace_id=workspace.id,
        target=workspace.id,
        role=workspace.approval_role,
        timeout=workspace.approval_timeout,
        commands=workspace.approval_commands,
    )
    enqueue(WORKSPACE_AGENT_CONFIGURE, workspace_id=workspace.id)
    return workspace


def _command_patterns(commands: list[str]) -> list[str]:
    """Each pattern's words, once each, in the order given; blank lines dropped."""
    patterns = list(dict.fromkeys(" ".join(c.split()) for c in commands if c.strip()))
    message = None
    if len(patterns) > MAX_COMMAND_PATTERNS:
        message = _("At most %(n)s commands wait for an approval.") % {"n": MAX_COMMAND_PATTERNS}
    elif any(len(p) > MAX_COMMAND_PATTERN for p in patterns):
        message = _("A command pattern has %(n)s characters at most.") % {"n": MAX_COMMAND_PATTERN}
    if message:
        raise Invalid(message, fields={"approvalCommands": [message]})
    return patterns


def approval_role_needed(workspace: Workspace) -> Role:
    """Who may answer: the policy's role, never below the one that may take control of the desktops
    (approving lets the agent act on them)."""
    return max(Role(workspace.approval_role), Role(workspace.control_role), key=lambda role: role.rank)


def approval_digest(*, desktop_id: str, title: str, details: str, cwd: str) -> str:
    """What an approval is bound to; the `bureau` helper in the desktop computes the same."""
    canonical = json.dumps([desktop_id, title, details, cwd], ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def desktop_by_token(token: str) -> Desktop | None:
    """The live desktop whose own token this is (a destroyed desktop's token is revoked)."""
    if not token:
        return None
    live = Desktop.objects.exclude(state__in=(DesktopState.DESTROYING, DesktopState.DESTROYED))
    return live.select_related("workspace").filter(agent_token_hash=api_token_hash(token)).first()


def _hidden_character(text: str) -> str | None:
    """The first character that shows nothing or reorders what follows (bidi and zero-width controls, and
    control characters but tab and newlines): the approver reads the request as the digest binds it."""
    for character in text:
        kind = unicodedata.category(character)
        if kind == "Cf" or (kind == "Cc" and character not in "\t\n\r"):
            return character
    return None


def approval_request(
    *, desktop: Desktop, title: str, details: str = "", cwd: str = "", timeout: int | None = None
) -> Approval:
    """A desktop asks; the request waits `timeout` seconds (the workspace's default if None)."""
    errors = {}
    if not title.strip() or len(title) > MAX_TITLE:
        errors["title"] = [_("Give a title of 1 to %(n)s characters.") % {"n": MAX_TITLE}]
    if len(details) > MAX_DETAILS:
        errors["details"] = [_("The details may hold %(n)s characters at most.") % {"n": MAX_DETAILS}]
    if len(cwd) > MAX_CWD:
        errors["cwd"] = [_("The working directory may hold %(n)s characters at most.") % {"n": MAX_CWD}]
    for field, text in (("title", title), ("details", details), ("cwd", cwd)):
        if hidden := _hidden_character(text):
            errors.setdefault(field, []).append(
                _("Holds %(char)s, which would make the approver read other words than those asked.")
                % {"char": f"U+{ord(hidden):04X} ({unicodedata.name(hidden, 'control')})"}
            )
    if timeout is not None and not 1 <= timeout <= MAX_TIMEOUT:
        errors["timeout"] = [_("Wait 1 to %(n)s seconds.") % {"n": MAX_TIMEOUT}]
    if errors:
        raise Invalid(next(iter(errors.values()))[0], fields=errors)
    seconds = timeout or desktop.workspace.approval_timeout
    with transaction.atomic():
        # Counted under the desktop's row lock: two requests at once cannot both take the last place.
        Desktop.objects.select_for_update().filter(id=desktop.id).exists()
        waiting = desktop.approvals.filter(status=Status.PENDING, expires_at__gt=timezone.now())
        if waiting.count() >= MAX_PENDING:
            raise Conflict(
                _("%(n)s requests of this desktop already wait for an answer: wait for one first.")
                % {"n": MAX_PENDING}
            )
        approval = Approval.objects.create(
            desktop=desktop,
            turn=desktop.messages.filter(status=ChatMessage.Status.RUNNING).first(),
            title=title,
            details=details,
            cwd=cwd,
            digest=approval_digest(desktop_id=desktop.id, title=title, details=details, cwd=cwd),
            expires_at=timezone.now() + timedelta(seconds=seconds),
        )
        # The title says what is at stake; the details (a diff, a command) stay with the request.
        audit_record(
            actor=desktop_actor(desktop),
            action="approval.request",
            workspace_id=desktop.workspace_id,
            target=desktop.id,
            approval=approval.id,
            title=title,
            timeout=seconds,
        )
        _publish(approval)
        enqueue(APPROVAL_EMAIL, approval_id=approval.id, workspace_id=desktop.workspace_id)
        enqueue(APPROVAL_SCREENSHOT, approval_id=approval.id, workspace_id=desktop.workspace_id)
    return approval


# Wide enough to read a terminal or a page by, small enough to keep with every request.
SCREENSHOT = ScreenshotOptions(format="jpeg", width=1280)
# A worker's time is everyone's: a screen that does not answer this fast goes without its screenshot.
SCREENSHOT_SECONDS = 3


def approval_screenshot_take(*, approval_id: str) -> bool:
    """Keep the asking desktop's screen with its request, while it still waits; False when the screen
    could not be read (the request stands without it)."""
    approval = Approval.objects.select_related("desktop__workspace").filter(id=approval_id).first()
    if approval is None or approval_status(approval) != Status.PENDING:
        return False
    try:
        shot = screen_screenshot(
            desktop=approval.desktop, options=SCREENSHOT, caller=None, seconds=SCREENSHOT_SECONDS
        )
    except (Conflict, Unavailable):
        return False
    ApprovalScreenshot.objects.update_or_create(
        approval=approval, defaults={"image": shot.data, "content_type": shot.content_type}
    )
    _publish(approval)  # the queues show it
    return True


def approval_has_screenshot(approval: Approval) -> bool:
    known = getattr(approval, "has_screenshot", None)  # annotated by approval_list
    return known if known is not None else ApprovalScreenshot.objects.filter(approval_id=approval.id).exists()


def approval_screenshot_get(*, actor: Actor, approval_id: str) -> ApprovalScreenshot:
    approval = approval_get(actor=actor, approval_id=approval_id)
    shot = ApprovalScreenshot.objects.filter(approval=approval).first()
    if shot is None:
        raise NotFound(_("No screenshot was kept with request %(id)s.") % {"id": approval_id})
    return shot


# The window of APPROVAL_EMAILS_PER_HOUR.
EMAILS_WINDOW = timedelta(hours=1)


def approval_email(*, approval_id: str) -> int:
    """Tell the people who may answer a request that it waits, by e-mail; how many were told."""
    approval = Approval.objects.select_related("desktop__workspace").filter(id=approval_id).first()
    if approval is None or approval_status(approval) != Status.PENDING:
        return 0
    # An agent writes the words of these mails: a desktop's requests are mailed APPROVAL_EMAILS_PER_HOUR
    # an hour at most (the others wait in the inbox all the same), so that it cannot serve as a spam relay.
    rank = Approval.objects.filter(
        desktop_id=approval.desktop_id,
        requested_at__gt=approval.requested_at - EMAILS_WINDOW,
        requested_at__lte=approval.requested_at,
    ).count()
    if rank > settings.APPROVAL_EMAILS_PER_HOUR:
        return 0
    workspace = approval.desktop.workspace
    emails = member_emails(workspace=workspace, minimum=approval_role_needed(workspace))
    words = {
        "desktop": approval.desktop.name,
        "title": approval.title,
        "details": approval.details[:2000],
        "cwd": approval.cwd,
        "until": timezone.localtime(approval.expires_at).strftime("%Y-%m-%d %H:%M %Z"),
        "link": _described(approval)["answerAt"],
    }
    subject = _("[Le Bureau] %(desktop)s asks: %(title)s") % words
    body = (
        _(
            "The agent of %(desktop)s asks for your approval before going on. What follows is the "
            "agent's own wording, not Le Bureau's:\n\n%(title)s\n\n%(details)s\n\n"
            "(in %(cwd)s)\n\nApprove or deny it before %(until)s, or it is refused: %(link)s\n"
        )
        % words
    )
    if rank == settings.APPROVAL_EMAILS_PER_HOUR:
        last = _("This desktop's further requests this hour wait in the inbox without an e-mail.")
        body += f"\n{last}\n"
    return send_mass_mail([(subject, body, None, [email]) for email in emails])


def approval_decide(*, actor: Actor, approval_id: str, approve: bool, comment: str = "") -> Approval:
    """Answer a pending request, once: the first answer stands."""
    approval = approval_get(actor=actor, approval_id=approval_id)
    workspace = approval.desktop.workspace
    role, needed = role_in(actor=actor, workspace_id=workspace.id), approval_role_needed(workspace)
    if role.rank < needed.rank:
        raise Forbidden(
            _("Answering this workspace's requests for approval needs the %(role)s role; you are %(yours)s.")
            % {"role": needed.label, "yours": role.label}
        )
    if len(comment) > MAX_COMMENT:
        message = _("A comment has %(n)s characters at most.") % {"n": MAX_COMMENT}
        raise Invalid(message, fields={"comment": [message]})
    _expire(approval_id)
    decision = Status.APPROVED if approve else Status.DENIED
    now = timezone.now()
    with transaction.atomic():
        # Conditional on its still waiting: of two answers (or an answer and the timeout), one wins.
        if not Approval.objects.filter(id=approval.id, status=Status.PENDING, expires_at__gt=now).update(
            status=decision, decided_by=actor.user, decided_at=now, comment=comment
        ):
            raise Conflict(_("This request has already been answered or has timed out."))
        approval.refresh_from_db()
        audit_record(
            actor=actor,
            action=f"approval.{decision}",
            workspace_id=workspace.id,
            target=approval.desktop_id,
            approval=approval.id,
            comment=comment,
        )
        _publish(approval)
    return approval


def approval_for_desktop(*, desktop: Desktop, approval_id: str) -> Approval:
    """One of the desktop's own requests, as the desktop sees it (timed out once its time is up)."""
    _expire(approval_id)
    approval = desktop.approvals.select_related("decided_by").filter(id=approval_id).first()
    if approval is None:
        raise NotFound(_("Request %(id)s not found.") % {"id": approval_id})
    return approval


def approvals_expire() -> int:
    """Refuse every request whose time is up; how many there were."""
    due = Approval.objects.filter(status=Status.PENDING, expires_at__lte=timezone.now())
    return sum(_expire(approval_id) for approval_id in due.values_list("id", flat=True))


def _expire(approval_id: str) -> bool:
    with transaction.atomic():
        if not Approval.objects.filter(
            id=approval_id, status=Status.PENDING, expires_at__lte=timezone.now()
        ).update(status=Status.EXPIRED, decided_at=timezone.now()):
            return False
        approval = Approval.objects.select_related("desktop").get(id=approval_id)
        audit_record(
            actor=SYSTEM,
            action="approval.expired",
            workspace_id=approval.desktop.workspace_id,
            target=approval.desktop_id,
            approval=approval.id,
        )
        _publish(approval)
    return True


def approval_list(
    *, actor: Actor, workspace_id: str | None = None, desktop_id: str | None = None, status: str | None = None
) -> QuerySet[Approval]:
    """The requests of the workspaces the actor belongs to, newest first; pending ones past their time
    count as timed out."""
    if workspace_id:
        workspace_get(actor=actor, workspace_id=workspace_id)
    approvals = Approval.objects.filter(desktop__workspace__in=workspaces_visible(actor=actor))
    if workspace_id:
        approvals = approvals.filter(desktop__workspace_id=workspace_id)
    if desktop_id:
        approvals = approvals.filter(desktop_id=desktop_id)
    now = timezone.now()
    if status == Status.PENDING:
        approvals = approvals.filter(status=Status.PENDING, expires_at__gt=now)
    elif status == Status.EXPIRED:
        approvals = approvals.filter(status__in=(Status.PENDING, Status.EXPIRED)).exclude(
            status=Status.PENDING, expires_at__gt=now
        )
    elif status:
        approvals = approvals.filter(status=status)
    kept = ApprovalScreenshot.objects.filter(approval=OuterRef("pk"))
    return approvals.select_related("desktop", "decided_by", "turn__reply_to").annotate(
        has_screenshot=Exists(kept)
    )


def approvals_waiting_count(*, workspace_id: str) -> int:
    """The workspace's requests still waiting for an answer, for its pages' menu."""
    waiting = Approval.objects.filter(desktop__workspace_id=workspace_id, status=Status.PENDING)
    return waiting.filter(expires_at__gt=timezone.now()).count()


def approvals_waiting_by_desktop(*, desktop_ids: list[str]) -> dict[str, int]:
    """How many requests wait for an answer, by desktop (those with none are left out)."""
    waiting = Approval.objects.filter(
        desktop_id__in=desktop_ids, status=Status.PENDING, expires_at__gt=timezone.now()
    )
    return dict(waiting.values("desktop_id").annotate(n=Count("id")).values_list("desktop_id", "n"))


def approval_get(*, actor: Actor, approval_id: str) -> Approval:
    approval = approval_list(actor=actor).filter(id=approval_id).first()
    if approval is None:
        raise NotFound(_("Request %(id)s not found.") % {"id": approval_id})
    return approval


def approval_status(approval: Approval) -> str:
    """Its status as people should read it: a pending request past its time has timed out."""
    if approval.status == Status.PENDING and approval.expires_at <= timezone.now():
        return Status.EXPIRED
    return approval.status


# What a workspace's webhook is told, by the request's status.
WEBHOOK_EVENTS = {
    Status.PENDING: "approval.requested",
    Status.APPROVED: "approval.approved",
    Status.DENIED: "approval.denied",
    Status.EXPIRED: "approval.expired",
}


def _publish(approval: Approval) -> None:
    webhook_notify(
        workspace_id=approval.desktop.workspace_id,
        event=WEBHOOK_EVENTS[approval.status],
        payload={"approval": _described(approval)},
    )
    publish_approval_change(
        ApprovalChanged(
            approval_id=approval.id,
            desktop_id=approval.desktop_id,
            workspace_id=approval.desktop.workspace_id,
            status=approval.status,
        )
    )


def _described(approval: Approval) -> dict:
    """The request as a webhook receiver reads it, with where to answer it."""
    workspace_id = approval.desktop.workspace_id
    return {
        "id": approval.id,
        "workspaceId": workspace_id,
        "desktopId": approval.desktop_id,
        "desktopName": approval.desktop.name,
        "title": approval.title,
        "details": approval.details,
        "cwd": approval.cwd,
        "turn": approval.turn_id or "",
        "digest": approval.digest,
        "status": approval.status,
        "requestedAt": approval.requested_at.isoformat(),
        "expiresAt": approval.expires_at.isoformat(),
        "decidedBy": approval.decided_by.email if approval.decided_by else "",
        "comment": approval.comment,
        # Mission Control's URLs, even when asked from the guest endpoint (which serves only its own).
        "answerAt": settings.SITE_URL
        + reverse("approvals", args=[workspace_id], urlconf=settings.ROOT_URLCONF),
    }
