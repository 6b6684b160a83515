"""Hooks on Django's authentication signals: audit every log-in, give first-timers a workspace."""

from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.dispatch import receiver

from desktops import services
from desktops.audit import Actor, audit_record


@receiver(user_logged_in)
def on_login(sender, request, user, **kwargs):
    # Invited people join the inviting workspace; everyone else gets one of their own.
    services.invitations_accept(user=user)
    services.workspace_ensure_for_user(user=user)
    audit_record(actor=Actor(user=user), action="auth.login", target=f"user:{user.pk}")


@receiver(user_login_failed)
def on_login_failed(sender, credentials, request=None, **kwargs):
    # Only the identifier tried is kept; the password never reaches the trail.
    tried = credentials.get("email") or credentials.get("username") or ""
    audit_record(actor=Actor(system="anonymous"), action="auth.login_failed", target=tried[:200])
