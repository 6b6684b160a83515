"""Hooks on Django's signals: audit every log-in, give first-timers a workspace, and cut open relays and
event streams at once when an account is deactivated, deleted or given a new password, or a membership or
API key is deleted, whichever path did it (a service, the admin, a shell). Relays also check again on
every heartbeat, which catches what no signal reports (a queryset update)."""

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.db.models.signals import post_delete, post_save, pre_save
from django.dispatch import receiver

from desktops import selectors, services
from desktops.audit import Actor, audit_record
from desktops.events import AccessChanged, publish_access_change, publish_api_key_revoked
from desktops.models import ApiKey, Membership
from desktops.relays import relays_end_for_new_password


@receiver(user_logged_in)
def on_login(sender, request, user, **kwargs):
    # Invited people answer their invitations first (Mission Control shows them, or what is left to
    # do: confirm the invited address), and land in the inviter's workspace; others get one of their own.
    if not (selectors.invitations_for(user=user).exists() or selectors.invitations_unconfirmed(user=user)):
        services.workspace_ensure_for_user(user=user)
    audit_record(actor=Actor(user=user), action="auth.login", target=f"user:{user.pk}")


@receiver(user_login_failed)
def on_login_failed(sender, credentials, request=None, **kwargs):
    # Only the identifier tried is kept; the password never reaches the trail.
    tried = credentials.get("email") or credentials.get("username") or ""
    audit_record(actor=Actor(system="anonymous"), action="auth.login_failed", target=tried[:200])


def _access_changed_everywhere(user, *, sessions_ended: bool = False) -> None:
    for workspace_id in Membership.objects.filter(user=user).values_list("workspace_id", flat=True):
        publish_access_change(
            AccessChanged(user_id=user.pk, workspace_id=workspace_id, sessions_ended=sessions_ended)
        )


@receiver(pre_save, sender=get_user_model())
def on_user_saving(sender, instance, **kwargs):
    # set_password() keeps the new password here until save(): whoever set it (a page, the admin, a command).
    instance.password_is_new = instance.pk is not None and getattr(instance, "_password", None) is not None


@receiver(post_save, sender=get_user_model())
def on_user_saved(sender, instance, **kwargs):
    if getattr(instance, "password_is_new", False):
        # The old password may be what leaked: what was opened with it ends (Django ends its sessions).
        relays_end_for_new_password(user_id=instance.pk)
        _access_changed_everywhere(instance, sessions_ended=True)
    elif not instance.is_active:
        _access_changed_everywhere(instance)


@receiver(post_delete, sender=Membership)
def on_membership_deleted(sender, instance, **kwargs):
    # Whoever deleted it: a service, the admin, or an account deleted with its memberships.
    publish_access_change(AccessChanged(user_id=instance.user_id, workspace_id=instance.workspace_id))


@receiver(post_delete, sender=ApiKey)
def on_api_key_deleted(sender, instance, **kwargs):
    publish_api_key_revoked(instance.id, instance.created_by_id, instance.workspace_id)
