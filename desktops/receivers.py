"""Hooks on Django's signals: audit every log-in, give first-timers a workspace, and cut a deactivated
account's open relays and event streams at once."""

from django.contrib.auth import get_user_model
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.db.models.signals import post_save
from django.dispatch import receiver

from desktops import selectors, services
from desktops.audit import Actor, audit_record
from desktops.events import AccessChanged, publish_access_change
from desktops.models import Membership


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


@receiver(post_save, sender=get_user_model())
def on_user_saved(sender, instance, **kwargs):
    # A deactivated account's open relays and event streams close now, in every workspace.
    if not instance.is_active:
        for workspace_id in Membership.objects.filter(user=instance).values_list("workspace_id", flat=True):
            publish_access_change(AccessChanged(user_id=instance.pk, workspace_id=workspace_id))
