"""Live events about desktops, one typed payload per kind, shared by producers and consumers.

Producers call `publish_*` inside their transaction; the event leaves only once it commits,
to two audiences: the relays (Channels groups, `desktop.<id>` and `user.<id>`) and the open
Mission Control pages (server-sent events, one stream per workspace).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import asdict, dataclass

import django_grip  # noqa: F401 (django_eventstream imports it at its first event: here, before a worker forks)
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction
from django_eventstream import send_event


def desktop_group(desktop_id: str) -> str:
    return f"desktop.{desktop_id}"


def user_group(user_id: int) -> str:
    return f"user.{user_id}"


def api_key_group(api_key_id: str) -> str:
    return f"apikey.{api_key_id}"


def workspace_stream(workspace_id: str) -> str:
    return f"workspace-{workspace_id}"


@dataclass(frozen=True)
class DesktopStateChanged:
    """A desktop's state (or provision step) changed; carries what a list row shows."""

    desktop_id: str
    workspace_id: str
    name: str
    state: str
    private_ip: str | None
    progress: str
    last_error: str
    state_changed_at: str
    type: str = "desktop.state"

    @classmethod
    def of(cls, desktop) -> DesktopStateChanged:
        return cls(
            desktop_id=desktop.id,
            workspace_id=desktop.workspace_id,
            name=desktop.name,
            state=desktop.state,
            private_ip=desktop.private_ip,
            progress=desktop.progress,
            last_error=desktop.last_error,
            state_changed_at=desktop.state_changed_at.isoformat(),
        )


@dataclass(frozen=True)
class AccessChanged:
    """A user's role in a workspace changed or ended (or their account or API key did): open relays
    and event streams must check again, at once."""

    user_id: int
    workspace_id: str
    # Their browser sessions ended (a new password): their streams close, to open again only from a
    # session still valid.
    sessions_ended: bool = False
    type: str = "access.changed"


@dataclass(frozen=True)
class ChatUpdated:
    """An agent's answer grew or ended: `text` is what came at character `at` of its content."""

    message_id: str
    desktop_id: str
    workspace_id: str
    status: str
    at: int
    text: str
    type: str = "chat.message"


@dataclass(frozen=True)
class ApprovalChanged:
    """A request for approval was made or answered: the queues on the pages refresh from the API."""

    approval_id: str
    desktop_id: str
    workspace_id: str
    status: str
    type: str = "approval.changed"


@dataclass(frozen=True)
class AlertChanged:
    """An alert was raised or acknowledged: the alert lists and counts on the pages refresh."""

    alert_id: str
    desktop_id: str
    workspace_id: str
    status: str
    type: str = "alert.changed"


@dataclass(frozen=True)
class WatchersChanged:
    """Someone opened or closed a desktop's screen or terminal: its viewers show who watches anew."""

    desktop_id: str
    workspace_id: str
    type: str = "desktop.watchers"


@dataclass(frozen=True)
class LLMKeyChecked:
    """A key's provider answered whether it takes the key (checked in the background once it is saved)."""

    key_id: str
    workspace_id: str
    name: str
    verdict: str
    type: str = "llm_key.checked"


_pending: set[asyncio.Task] = set()


def _group_send(group: str, payload: dict) -> None:
    layer = get_channel_layer()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        async_to_sync(layer.group_send)(group, payload)
    else:  # called from code running on an event loop: never block that loop
        task = loop.create_task(layer.group_send(group, payload))
        _pending.add(task)  # keep a reference until it is done, as asyncio asks
        task.add_done_callback(_pending.discard)


def publish_state_change(event: DesktopStateChanged) -> None:
    def send():
        _group_send(desktop_group(event.desktop_id), asdict(event))
        send_event(workspace_stream(event.workspace_id), "desktop", asdict(event))

    transaction.on_commit(send)


def publish_chat_update(event: ChatUpdated) -> None:
    transaction.on_commit(lambda: send_event(workspace_stream(event.workspace_id), "chat", asdict(event)))


def publish_approval_change(event: ApprovalChanged) -> None:
    transaction.on_commit(lambda: send_event(workspace_stream(event.workspace_id), "approval", asdict(event)))


def publish_alert_change(event: AlertChanged) -> None:
    transaction.on_commit(lambda: send_event(workspace_stream(event.workspace_id), "alert", asdict(event)))


def publish_watchers_change(event: WatchersChanged) -> None:
    transaction.on_commit(lambda: send_event(workspace_stream(event.workspace_id), "watchers", asdict(event)))


def publish_llm_key_checked(event: LLMKeyChecked) -> None:
    transaction.on_commit(lambda: send_event(workspace_stream(event.workspace_id), "llm_key", asdict(event)))


def publish_access_change(event: AccessChanged) -> None:
    def send():
        _group_send(user_group(event.user_id), asdict(event))
        # The open pages' event streams live in the web processes; each drops the user's if need be.
        redis_client().publish(ACCESS_CHANNEL, json.dumps(asdict(event)))

    transaction.on_commit(send)


def publish_api_key_revoked(api_key_id: str, user_id: int, workspace_id: str) -> None:
    event = AccessChanged(user_id=user_id, workspace_id=workspace_id)
    transaction.on_commit(lambda: _group_send(api_key_group(api_key_id), asdict(event)))


# The Redis channel on which access changes reach every web process (see missioncontrol.streams).
ACCESS_CHANNEL = "lebureau.access"


def redis_client():
    return redis.Redis(**settings.EVENTSTREAM_REDIS)
