"""Django's makemessages, also gathering the strings marked `_lazy` (the house's name for gettext_lazy)."""

from django.core.management.commands import makemessages


class Command(makemessages.Command):
    xgettext_options = [*makemessages.Command.xgettext_options, "--keyword=_lazy"]
