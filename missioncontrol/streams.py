"""Who may read which server-sent event stream: a workspace's stream, its members only."""

from django_eventstream.channelmanager import DefaultChannelManager

from desktops.audit import Actor
from desktops.selectors import role_in


class WorkspaceStreams(DefaultChannelManager):
    def can_read_channel(self, user, channel):
        prefix, _, workspace_id = channel.partition("-")
        if prefix != "workspace" or user is None or not user.is_authenticated:
            return False
        return role_in(actor=Actor(user=user), workspace_id=workspace_id) is not None
