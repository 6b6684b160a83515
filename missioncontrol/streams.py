"""Who may read which server-sent event stream (a workspace's stream, its members only), and how an
open stream is cut the moment its reader loses access.

The permission is checked when a stream opens (and cached briefly, as pages open often). Streams do
not check it again per event, so an access change ("lebureau.access" on Redis, published by
``desktops.events.publish_access_change``) reaches every web process, where a listener task forgets
the cached answer and ends that user's streams of the workspace if they may no longer read it.
"""

import asyncio
import json
import logging
import time

import redis.asyncio
from asgiref.sync import sync_to_async
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection
from django_eventstream.channelmanager import DefaultChannelManager
from django_eventstream.eventstream import channel_permission_changed

from desktops.audit import Actor
from desktops.events import ACCESS_CHANNEL, AccessChanged, workspace_stream
from desktops.selectors import role_in

logger = logging.getLogger(__name__)
# A page opening again within this many seconds reuses the answer (access changes drop it at once).
RECHECK_SECONDS = 5.0


# (user, workspace) -> (allowed, when checked); shared by the threads of this process, as the library
# makes one channel manager per thread.
_checked: dict[tuple[int, str], tuple[bool, float]] = {}


class WorkspaceStreams(DefaultChannelManager):
    def can_read_channel(self, user, channel):
        prefix, _, workspace_id = channel.partition("-")
        if prefix != "workspace" or user is None or not user.is_authenticated:
            return False
        key = (user.pk, workspace_id)
        allowed, checked_at = _checked.get(key, (False, 0.0))
        if time.monotonic() - checked_at > RECHECK_SECONDS:
            fresh = get_user_model().objects.filter(pk=user.pk, is_active=True).first()
            allowed = (
                fresh is not None and role_in(actor=Actor(user=fresh), workspace_id=workspace_id) is not None
            )
            _checked[key] = (allowed, time.monotonic())
            # This can run in an open stream's thread: give the connection back rather than hold one per page.
            connection.close()
        return allowed


_listener: asyncio.Task | None = None


def watched(content):
    """An event stream's body, with this process's access-change listener running beside it."""

    async def body():
        global _listener
        if _listener is None or _listener.done():
            _listener = asyncio.get_running_loop().create_task(_listen())
        async for chunk in content:
            yield chunk

    return body()


async def _listen():
    client = redis.asyncio.Redis(**settings.EVENTSTREAM_REDIS)
    async with client.pubsub() as pubsub:
        await pubsub.subscribe(ACCESS_CHANNEL)
        async for message in pubsub.listen():
            if message["type"] == "message":
                await sync_to_async(_recheck)(AccessChanged(**json.loads(message["data"])))


def _recheck(change: AccessChanged) -> None:
    user_id, channel = change.user_id, workspace_stream(change.workspace_id)
    key = (user_id, change.workspace_id)
    _checked.pop(key, None)
    if change.sessions_ended:
        # Every stream of theirs ends: refused for a moment (RECHECK_SECONDS), then a page whose session
        # is still valid opens it again by itself.
        _checked[key] = (False, time.monotonic())
    # A deleted account is looked for by its id alone: its streams are found (and kicked) by it.
    user = get_user_model().objects.filter(pk=user_id).first() or get_user_model()(pk=user_id)
    try:
        channel_permission_changed(user, channel)
    finally:
        connection.close()
