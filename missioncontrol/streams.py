"""Who may read which server-sent event stream: a workspace's stream, its members only."""

import time

from django.db import connection
from django_eventstream.channelmanager import DefaultChannelManager

from desktops.audit import Actor
from desktops.selectors import role_in

# The stream checks again at every event it sends; a member who leaves stops receiving within this.
RECHECK_SECONDS = 5.0


class WorkspaceStreams(DefaultChannelManager):
    def __init__(self):
        self._checked: dict[tuple[int, str], tuple[bool, float]] = {}

    def can_read_channel(self, user, channel):
        prefix, _, workspace_id = channel.partition("-")
        if prefix != "workspace" or user is None or not user.is_authenticated:
            return False
        key = (user.pk, workspace_id)
        allowed, checked_at = self._checked.get(key, (False, 0.0))
        if time.monotonic() - checked_at > RECHECK_SECONDS:
            allowed = role_in(actor=Actor(user=user), workspace_id=workspace_id) is not None
            self._checked[key] = (allowed, time.monotonic())
            # This runs in an open stream's thread: give the connection back rather than hold one per page.
            connection.close()
        return allowed
