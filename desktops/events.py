"""Live events about desktops, one typed payload per kind, shared by producers and consumers.

Producers call `publish_*` inside their transaction; the message leaves only once it
commits. Consumers (relays, live pages) join the groups named here.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction


def desktop_group(desktop_id: str) -> str:
    return f"desktop.{desktop_id}"


def user_group(user_id: int) -> str:
    return f"user.{user_id}"


@dataclass(frozen=True)
class DesktopStateChanged:
    desktop_id: str
    workspace_id: str
    state: str
    type: str = "desktop.state"


@dataclass(frozen=True)
class AccessChanged:
    """A user's role in a workspace changed or ended: open sessions must check again."""

    user_id: int
    workspace_id: str
    type: str = "access.changed"


_pending: set[asyncio.Task] = set()


def _send(group: str, payload: dict) -> None:
    layer = get_channel_layer()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        async_to_sync(layer.group_send)(group, payload)
    else:  # called from code running on an event loop: never block that loop
        task = loop.create_task(layer.group_send(group, payload))
        _pending.add(task)  # keep a reference until it is done, as asyncio asks
        task.add_done_callback(_pending.discard)


def _send_on_commit(group: str, event) -> None:
    transaction.on_commit(lambda: _send(group, asdict(event)))


def publish_state_change(event: DesktopStateChanged) -> None:
    _send_on_commit(desktop_group(event.desktop_id), event)


def publish_access_change(event: AccessChanged) -> None:
    _send_on_commit(user_group(event.user_id), event)
