from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from desktops import services
from desktops.audit import Actor
from desktops.errors import DomainError
from desktops.models import ApiScope


class Command(BaseCommand):
    help = "Issue a platform API key for a user's workspace and print it (shown once)."

    def add_arguments(self, parser):
        parser.add_argument("email")
        parser.add_argument("--workspace", help="Workspace id (ws_…); the user's only workspace by default")
        parser.add_argument("--name", default="cli")
        parser.add_argument("--scope", choices=ApiScope.values, default=ApiScope.WRITE)

    def handle(self, email, workspace, name, scope, **options):
        user = get_user_model().objects.filter(email__iexact=email).first()
        if user is None:
            raise CommandError(f"No user has the email {email}.")
        services.workspace_ensure_for_user(user=user)
        memberships = user.memberships.select_related("workspace")
        if workspace:
            memberships = memberships.filter(workspace_id=workspace)
        if memberships.count() != 1:
            choices = ", ".join(m.workspace_id for m in memberships)
            raise CommandError(f"Name the workspace with --workspace: {choices}")
        try:
            _, token = services.api_key_create(
                actor=Actor(user=user), workspace_id=memberships.get().workspace_id, name=name, scope=scope
            )
        except DomainError as exc:
            raise CommandError(exc.message) from exc
        self.stdout.write(token)
