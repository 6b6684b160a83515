"""Every write of the domain: the API, the pages and the admin all come through here."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import pgettext_lazy

from billing.quotas import quota_check_action, quota_check_create
from billing.services import subscription_start
from desktops import crypto
from desktops.agent_failures import NO_LLM_KEY
from desktops.audit import Actor, audit_record
from desktops.egress import egress_preset_create, workspace_egress_apply
from desktops.engines import engine_for_new_desktops, engine_instance_for_new_desktops
from desktops.errors import Conflict, Forbidden, Invalid, NotFound, TooBusy
from desktops.events import AccessChanged, publish_access_change, publish_api_key_revoked
from desktops.labels import labels_checked
from desktops.lifecycle import TRANSITIONS, transition
from desktops.models import (
    DEFAULT_AGENT_COMMAND,
    ApiKey,
    ChatMessage,
    Desktop,
    DesktopLabel,
    DesktopState,
    Invitation,
    LLMKey,
    LLMProvider,
    Membership,
    Plan,
    Role,
    Workspace,
)
from desktops.queue import CHAT_DELIVER, LLM_KEY_CHECK, WORKSPACE_AGENT_CONFIGURE, enqueue, enqueue_step
from desktops.selectors import (
    agent_key_missing,
    invitation_token,
    invitations_for,
    invitations_sent_since,
    role_in,
    workspace_for_control,
    workspace_get,
)


def _validated(instance, **kwargs):
    """Run model validation and turn Django's errors into one clear 400."""
    try:
        instance.full_clean(**kwargs)
    except ValidationError as exc:
        fields = {name: list(messages) for name, messages in exc.message_dict.items()}
        first = next(iter(fields.values()))[0]
        raise Invalid(first, fields=fields) from exc
    return instance


# Workspaces and members


def workspace_create(*, user, name: str) -> Workspace:
    with transaction.atomic():
        workspace = _validated(Workspace(name=name))
        workspace.save()
        Membership.objects.create(workspace=workspace, user=user, role=Role.OWNER)
        subscription_start(workspace=workspace, owner=user)
        egress_preset_create(workspace=workspace, user=user)
        audit_record(
            actor=Actor(user=user), action="workspace.create", workspace_id=workspace.id, target=workspace.id
        )
    return workspace


def workspace_ensure_for_user(*, user) -> Workspace | None:
    """First log-in: a user without a workspace gets one of their own."""
    if Membership.objects.filter(user=user).exists():
        return None
    label = (user.email or user.get_username()).split("@")[0]
    return workspace_create(user=user, name=_("%(name)s's workspace") % {"name": label})


def workspace_rename(*, actor: Actor, workspace_id: str, name: str) -> Workspace:
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    workspace.name = name
    _validated(workspace).save(update_fields=["name"])
    audit_record(actor=actor, action="workspace.rename", workspace_id=workspace.id, target=workspace.id)
    return workspace


def workspace_agent_command_set(*, actor: Actor, workspace_id: str, command: str) -> Workspace:
    """The command each chat message runs in the workspace's desktops; blank restores the default."""
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    command = command.strip() or DEFAULT_AGENT_COMMAND
    try:
        command.format(session="s", message="m")
    except (KeyError, IndexError, ValueError) as exc:
        raise Invalid(
            "Only {session} and {message} may be filled in (write {{ and }} for braces).",
            fields={"agentCommand": [f"Cannot fill in: {exc}"]},
        ) from exc
    if "{message}" not in command:
        raise Invalid(
            "The command must take the message: put {message} in it.",
            fields={"agentCommand": ["No {message}."]},
        )
    if _placeholder_in_quotes(command):
        # The message arrives shell-quoted; inside quotes of the template, $(…) in it would run.
        raise Invalid(
            "Put {session} and {message} outside quotes: they are quoted for the shell already.",
            fields={"agentCommand": ["A placeholder inside quotes."]},
        )
    workspace.agent_command = command
    _validated(workspace).save(update_fields=["agent_command"])
    audit_record(
        actor=actor, action="workspace.agent_command", workspace_id=workspace.id, target=workspace.id
    )
    return workspace


def workspace_control_role_set(*, actor: Actor, workspace_id: str, role: str) -> Workspace:
    """Which roles may take control of the workspace's desktops, and so read what they hold."""
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    if role not in (Role.MEMBER, Role.ADMIN, Role.OWNER):
        raise Invalid(
            _("Control goes to members, admins or owners."), fields={"controlRole": [_("Unknown.")]}
        )
    workspace.control_role = role
    workspace.save(update_fields=["control_role"])
    # Open relays of those who lose control close now.
    for user_id in workspace.memberships.values_list("user_id", flat=True):
        publish_access_change(AccessChanged(user_id=user_id, workspace_id=workspace.id))
    audit_record(
        actor=actor,
        action="workspace.control_role",
        workspace_id=workspace.id,
        target=workspace.id,
        role=role,
    )
    return workspace


def _placeholder_in_quotes(command: str) -> bool:
    quote = ""
    for i, char in enumerate(command):
        if quote and command.startswith(("{message}", "{session}"), i):
            return True
        if char == quote:
            quote = ""
        elif not quote and char in "'\"":
            quote = char
    return False


def workspace_delete(*, actor: Actor, workspace_id: str) -> None:
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.OWNER)
    live = workspace.desktops.exclude(state=DesktopState.DESTROYED).count()
    if live:
        raise Conflict(f"Destroy the workspace's {live} desktop(s) first.")
    audit_record(actor=actor, action="workspace.delete", workspace_id=workspace.id, target=workspace.id)
    workspace.delete()


def _members_locked(workspace_id: str) -> None:
    """Within the caller's transaction: changes to the workspace's members wait for each other from
    here to its commit, and the roles read after this are the ones that stand. Two owners demoting
    or removing each other at once cannot both succeed and leave the workspace without one."""
    Workspace.objects.select_for_update().filter(id=workspace_id).first()


def _ensure_an_owner_remains(workspace: Workspace, leaving: Membership) -> None:
    if leaving.role == Role.OWNER and not workspace.memberships.filter(role=Role.OWNER).exclude(
        id=leaving.id
    ):
        raise Conflict(_("A workspace keeps at least one owner; make someone else owner first."))


def _role_grantable(actor: Actor, workspace: Workspace, role: str) -> Role:
    if role not in Role.values:
        raise Invalid(
            f"Unknown role {role!r}.", fields={"role": [f"Choose one of {', '.join(Role.values)}."]}
        )
    if role == Role.OWNER and role_in(actor=actor, workspace_id=workspace.id) != Role.OWNER:
        raise Invalid(_("Only an owner can make someone owner."), fields={"role": [_("Not allowed.")]})
    return Role(role)


# Invitations a workspace may send within this window: INVITATIONS_PER_DAY.
INVITATIONS_WINDOW = timedelta(days=1)


def member_invite(*, actor: Actor, workspace_id: str, email: str, role: str) -> Invitation:
    """Offer a place in the workspace to an e-mail address; its owner accepts it, or not.

    Nobody is added without their consent: whoever pre-registers a future hire's address cannot join
    in their place (accepting needs that address confirmed). The answer is the same whether an
    account has the address or not, so the form tells nothing of who has an account.
    """
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    role = _role_grantable(actor, workspace, role)
    email = email.strip().lower()
    if workspace.memberships.filter(user__email__iexact=email).exists():
        raise Conflict(_("%(email)s is already a member of this workspace.") % {"email": email})
    if invitations_sent_since(workspace=workspace, since=timezone.now() - INVITATIONS_WINDOW) >= (
        settings.INVITATIONS_PER_DAY
    ):
        raise TooBusy(
            _("This workspace has sent %(n)s invitations in a day, the most it may: try again tomorrow.")
            % {"n": settings.INVITATIONS_PER_DAY},
            retry_after=int(INVITATIONS_WINDOW.total_seconds()),
        )
    # Sent again (or after a decline), it starts over: a fresh offer, not yet opened.
    fresh = {"accepted_at": None, "declined_at": None, "opened_by": None, "opened_at": None}
    invitation, _created = Invitation.objects.update_or_create(
        workspace=workspace, email=email, defaults={"role": role, "invited_by": actor.user, **fresh}
    )
    audit_record(
        actor=actor, action="member.invite", workspace_id=workspace.id, target=invitation.id, role=role
    )
    link = f"{settings.SITE_URL}{reverse('invitation', args=[invitation_token(invitation)])}"
    words = {"inviter": actor.user.email, "workspace": workspace.name, "role": role, "email": email}
    words["link"] = link
    # The workspace's name is its members' words, not ours: quoted, and said to be theirs.
    transaction.on_commit(
        lambda: send_mail(
            _("An invitation to a workspace on Le Bureau, from %(inviter)s") % words,
            _(
                "%(inviter)s invites you to a workspace of Le Bureau as %(role)s. Its members named it "
                "“%(workspace)s”.\n\n"
                "Open this link to accept the invitation: %(link)s\n\n"
                "Without an account, sign up there with this address, %(email)s. With one, sign in: "
                "the invitation is answered from this address, once it is confirmed.\n"
            )
            % words,
            None,
            [email],
        )
    )
    return invitation


def invitation_open(*, user, invitation: Invitation) -> bool:
    """The invitee opened the e-mailed link, signed in: their admins may see how far they got.

    Recorded only for an account holding the invited address (confirmed or not); the answer says
    whether it does.
    """
    holds = user.emailaddress_set.filter(email__iexact=invitation.email).exists()
    if holds and invitation.opened_by_id != user.pk:
        Invitation.objects.filter(id=invitation.id).update(opened_by=user, opened_at=timezone.now())
    return holds


def invitation_revoke(*, actor: Actor, workspace_id: str, invitation_id: str) -> Invitation:
    """Withdraw an invitation not accepted; the one withdrawn is returned (to send it again)."""
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    invitation = workspace.invitations.filter(id=invitation_id, accepted_at__isnull=True).first()
    if invitation is None:
        raise NotFound(_("Invitation %(id)s not found.") % {"id": invitation_id})
    invitation.delete()
    audit_record(actor=actor, action="member.invite_revoke", workspace_id=workspace.id, target=invitation_id)
    return invitation


def invitation_answer(*, user, invitation_id: str, accept: bool) -> Membership | None:
    """The invitee accepts (and joins) or declines, from an address of theirs they have confirmed."""
    invitation = invitations_for(user=user).filter(id=invitation_id).first()
    if invitation is None:
        raise NotFound(
            _("No invitation %(id)s for a confirmed address of yours: confirm the invited address first.")
            % {"id": invitation_id}
        )
    actor = Actor(user=user)
    answer = {"accepted_at": timezone.now()} if accept else {"declined_at": timezone.now()}
    with transaction.atomic():
        # Answered once: of two answers, one changes the row.
        pending = Invitation.objects.filter(id=invitation.id, accepted_at=None, declined_at=None)
        if not pending.update(**answer):
            raise Conflict(_("This invitation was answered already."))
        if not accept:
            workspace_id = invitation.workspace_id
            audit_record(
                actor=actor, action="member.decline", workspace_id=workspace_id, target=invitation.id
            )
            return None
        membership, _created = Membership.objects.get_or_create(
            workspace_id=invitation.workspace_id, user=user, defaults={"role": invitation.role}
        )
        audit_record(
            actor=actor,
            action="member.join",
            workspace_id=invitation.workspace_id,
            target=membership.id,
            invitation=invitation.id,
        )
    publish_access_change(AccessChanged(user_id=user.pk, workspace_id=invitation.workspace_id))
    return membership


def membership_set_role(*, actor: Actor, workspace_id: str, membership_id: str, role: str) -> Membership:
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    with transaction.atomic():
        _members_locked(workspace.id)
        role = _role_grantable(actor, workspace, role)
        membership = _membership_of(workspace, membership_id)
        _owner_only_for_owners(actor, workspace, membership)
        if role != Role.OWNER:
            _ensure_an_owner_remains(workspace, membership)
        membership.role = role
        membership.save(update_fields=["role"])
    publish_access_change(AccessChanged(user_id=membership.user_id, workspace_id=workspace.id))
    audit_record(
        actor=actor, action="member.role", workspace_id=workspace.id, target=membership.id, role=role
    )
    return membership


def membership_remove(*, actor: Actor, workspace_id: str, membership_id: str) -> Membership:
    """Take someone out of the workspace; the membership removed is returned (to invite them again)."""
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    with transaction.atomic():
        _members_locked(workspace.id)
        membership = _membership_of(workspace, membership_id)
        _owner_only_for_owners(actor, workspace, membership)
        _ensure_an_owner_remains(workspace, membership)
        membership.delete()  # its open relays and streams are cut by desktops.receivers
    # The address too: once the membership is gone, the log still says whom it was.
    audit_record(
        actor=actor,
        action="member.remove",
        workspace_id=workspace.id,
        target=membership_id,
        email=membership.user.email,
    )
    return membership


def _owner_only_for_owners(actor: Actor, workspace: Workspace, membership: Membership) -> None:
    if membership.role == Role.OWNER and role_in(actor=actor, workspace_id=workspace.id) != Role.OWNER:
        raise Forbidden(_("Only an owner can change or remove an owner."))


def _membership_of(workspace: Workspace, membership_id: str) -> Membership:
    membership = workspace.memberships.filter(id=membership_id).first()
    if membership is None:
        raise NotFound(f"Member {membership_id} not found.")
    return membership


# Desktops


def desktop_create(
    *,
    actor: Actor,
    workspace: Workspace,
    plan: Plan,
    name: str,
    image_profile: str = "",
    labels: Sequence[str] = (),
) -> Desktop:
    workspace_get(actor=actor, workspace_id=workspace.id, minimum=Role.MEMBER)
    labels = labels_checked(labels)
    desktop = Desktop(
        workspace=workspace,
        plan=plan,
        name=name,
        image_profile=image_profile or settings.DEFAULT_IMAGE_PROFILE,
        driver=engine_for_new_desktops(),
        engine_instance=engine_instance_for_new_desktops(),
        created_by=actor.user,
    )
    _validated(desktop, validate_constraints=True)
    try:
        with transaction.atomic():
            quota_check_create(workspace=workspace, plan=plan)
            desktop.save()
            desktop.labels.bulk_create([DesktopLabel(desktop=desktop, name=label) for label in labels])
            desktop.events.create(to_state=desktop.state, actor=actor.label, reason="created")
            audit_record(
                actor=actor,
                action="desktop.create",
                workspace_id=workspace.id,
                target=desktop.id,
                plan=plan.name,
                **({"labels": labels} if labels else {}),
            )
            enqueue_step(desktop_id=desktop.id, action="provision")
    except IntegrityError as exc:
        # Lost a race with another create of the same name.
        raise Conflict(_("A desktop with this name already exists in the workspace.")) from exc
    return desktop


def desktop_act(*, actor: Actor, desktop: Desktop, action: str) -> Desktop:
    """Request start / stop / suspend / resume / destroy; the worker does the rest. Destroying takes
    the disk and what the agent did with it: it needs the role that may take control, not only member."""
    if action == "destroy":
        workspace_for_control(actor=actor, workspace_id=desktop.workspace_id)
    else:
        workspace_get(actor=actor, workspace_id=desktop.workspace_id, minimum=Role.MEMBER)
    step = TRANSITIONS.get(action)
    if step is None or not step.sources:
        raise Invalid(f"Unknown action {action!r}.")
    with transaction.atomic():
        quota_check_action(desktop=desktop, action=action)
        if not transition(
            desktop_id=desktop.id, sources=step.sources, target=step.via, actor=actor, reason=action
        ):
            desktop.refresh_from_db(fields=["state"])
            labels = sorted(str(DesktopState(state).label) for state in step.sources)
            allowed = ", ".join(labels) if len(labels) < 4 else _("any state but destroying")
            raise Conflict(
                _("Cannot %(action)s a desktop that is %(state)s (allowed from: %(allowed)s).")
                % {"action": ACTION_VERBS[action], "state": desktop.get_state_display(), "allowed": allowed}
            )
        enqueue_step(desktop_id=desktop.id, action=action)
    desktop.refresh_from_db()
    return desktop


# What a lifecycle action is called inside a sentence ("Cannot stop a desktop that is …").
ACTION_VERBS = {
    "start": pgettext_lazy("desktop action", "start"),
    "stop": pgettext_lazy("desktop action", "stop"),
    "suspend": pgettext_lazy("desktop action", "suspend"),
    "resume": pgettext_lazy("desktop action", "resume"),
    "destroy": pgettext_lazy("desktop action", "destroy"),
}


# Chat

MAX_MESSAGE = 32_000


def chat_message_checked(message: str) -> str:
    """A message for the agent, stripped, or Invalid when it is empty or too long."""
    message = message.strip()
    if not message or len(message) > MAX_MESSAGE:
        raise Invalid(
            _("A message has 1 to %(max)d characters.") % {"max": MAX_MESSAGE},
            fields={"message": [_("Empty or too long.")]},
        )
    return message


def chat_send(*, actor: Actor, desktop: Desktop, message: str) -> ChatMessage:
    """Store an operator's message and queue the agent's turn; returns the (pending) reply.

    Instructing the agent is controlling its desktop: it takes the workspace's control role.
    """
    workspace_for_control(actor=actor, workspace_id=desktop.workspace_id)
    message = chat_message_checked(message)
    # A turn that could only fail fails at once, saying what to do, rather than after the agent's start.
    reply_fields = {"status": ChatMessage.Status.QUEUED}
    if no_key := agent_key_missing(desktop=desktop):
        reply_fields = {
            "status": ChatMessage.Status.ERROR,
            "content": NO_LLM_KEY,
            "completed_at": timezone.now(),
        }
    with transaction.atomic():
        sent = ChatMessage.objects.create(
            desktop=desktop, author=ChatMessage.Author.OPERATOR, content=message, created_by=actor.user
        )
        reply = ChatMessage.objects.create(
            desktop=desktop, author=ChatMessage.Author.AGENT, reply_to=sent, **reply_fields
        )
        # The words stay in the conversation, not in the audit trail: they may hold anything.
        audit_record(
            actor=actor,
            action="chat.send",
            workspace_id=desktop.workspace_id,
            target=desktop.id,
            length=len(message),
        )
        if not no_key:
            enqueue(CHAT_DELIVER, desktop_id=desktop.id)
    return reply


# Keys


def api_key_create(
    *, actor: Actor, workspace_id: str, name: str, scope: str, expires_at: datetime | None = None
) -> tuple[ApiKey, str]:
    """Create a platform key; the token is returned this once and never stored."""
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    if expires_at is not None and expires_at <= timezone.now():
        raise Invalid(
            _("The expiry must be in the future."), fields={"expiresAt": [_("Must be in the future.")]}
        )
    token, prefix = crypto.api_token_new()
    key = ApiKey(
        workspace=workspace,
        name=name,
        scope=scope,
        expires_at=expires_at,
        prefix=prefix,
        hashed=crypto.api_token_hash(token),
        created_by=actor.user,
    )
    _validated(key).save()
    audit_record(actor=actor, action="api_key.create", workspace_id=workspace.id, target=key.id, scope=scope)
    return key, token


def api_key_revoke(*, actor: Actor, workspace_id: str, key_id: str) -> None:
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    key = workspace.api_keys.filter(id=key_id, revoked_at__isnull=True).first()
    if key is None:
        return
    ApiKey.objects.filter(id=key.id).update(revoked_at=timezone.now())
    # Relays the key opened close now, not when their next check comes.
    publish_api_key_revoked(key.id, key.created_by_id, workspace.id)
    audit_record(actor=actor, action="api_key.revoke", workspace_id=workspace.id, target=key_id)


def llm_key_save(
    *,
    actor: Actor,
    workspace_id: str,
    provider: str,
    name: str,
    secret: str,
    base_url: str = "",
    model: str = "",
    key: LLMKey | None = None,
) -> LLMKey:
    """Add a BYOK key, or rotate `key` to a new secret; the workspace's running desktops get it."""
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    secret = secret.strip()
    if len(secret) < 8:
        raise Invalid(
            _("The key looks too short to be real."), fields={"secret": [_("At least 8 characters.")]}
        )
    if provider == LLMProvider.OPENAI_COMPATIBLE and not base_url:
        raise Invalid(_("An OpenAI-compatible key needs its baseUrl."), fields={"baseUrl": [_("Required.")]})
    if provider == LLMProvider.OPENAI_COMPATIBLE and not model:
        raise Invalid(
            _("An OpenAI-compatible key needs the model to use."), fields={"model": [_("Required.")]}
        )
    key = key or LLMKey(workspace=workspace, created_by=actor.user)
    rotating = key.pk is not None and not key._state.adding
    key.provider, key.name, key.base_url, key.model = provider, name, base_url, model
    key.secret_encrypted, key.last4 = crypto.secret_encrypt(secret), secret[-4:]
    key.verdict, key.check_detail, key.checked_at = LLMKey.Verdict.UNCHECKED, "", None
    _validated(key, validate_constraints=True).save()
    action = "llm_key.rotate" if rotating else "llm_key.create"
    audit_record(actor=actor, action=action, workspace_id=workspace.id, target=key.id, provider=provider)
    _push_agent_config(workspace.id)
    enqueue(LLM_KEY_CHECK, key_id=key.id)
    return key


def llm_key_delete(*, actor: Actor, workspace_id: str, key_id: str) -> None:
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    key = workspace.llm_keys.filter(id=key_id).first()
    if key is None:
        return
    key.delete()
    # Its name too: once the key is gone, the log still says which it was.
    audit_record(
        actor=actor, action="llm_key.delete", workspace_id=workspace.id, target=key_id, name=key.name
    )
    _push_agent_config(workspace.id)


def _push_agent_config(workspace_id: str) -> None:
    enqueue(WORKSPACE_AGENT_CONFIGURE, workspace_id=workspace_id)
    # The keys' hosts are allowed by allow-list policies: they change with the keys.
    workspace_egress_apply(workspace_id=workspace_id, all_desktops=True)
