"""The API, resource by resource. Each method is one operation (its `Endpoint`), written once as a plan.

Adding an endpoint of the API is: declare its `Endpoint`, add a method that calls it, add its model to
`models.py`; the drift test (tests/sdk/test_drift.py) names any operation still missing.
"""

from __future__ import annotations

import builtins
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from typing import Any

from lebureau_sdk import models as m
from lebureau_sdk._core import (
    Binary,
    Emit,
    Endpoint,
    M,
    Plan,
    Resource,
    Sleep,
    Stream,
    operation,
    pages,
    streaming,
)
from lebureau_sdk.errors import WaitTimeout

STEADY = ("running", "stopped", "suspended", "destroyed", "error")


# Desktops

DESKTOPS = Endpoint(
    "GET",
    "/api/desktops",
    m.Desktop,
    query=("workspace_id:workspace", "state", "labels:label", "name"),
    paged=True,
)
DESKTOP_CREATE = Endpoint(
    "POST", "/api/desktops", m.Desktop, body=("name", "workspace_id", "plan", "image_profile", "labels")
)
DESKTOP = Endpoint("GET", "/api/desktops/{desktop_id}", m.Desktop)
DESKTOP_DESTROY = Endpoint("DELETE", "/api/desktops/{desktop_id}", m.Desktop)
DESKTOP_ACT = Endpoint("POST", "/api/desktops/{desktop_id}/{step}", m.Desktop)
DESKTOP_EVENTS = Endpoint("GET", "/api/desktops/{desktop_id}/events", m.DesktopEvent, paged=True)
DESKTOP_USAGE = Endpoint("GET", "/api/desktops/{desktop_id}/usage", m.AgentUsage)
DESKTOP_COSTS = Endpoint("GET", "/api/desktops/{desktop_id}/costs", m.DesktopMonthCosts, query=("month",))
DESKTOP_SESSIONS = Endpoint("POST", "/api/desktops/{desktop_id}/sessions", m.RelaySession, body=("mode",))
DESKTOP_FILE_GET = Endpoint("GET", "/api/desktops/{desktop_id}/files", Binary, query=("path",))
DESKTOP_FILE_PUT = Endpoint("PUT", "/api/desktops/{desktop_id}/files", m.FileWritten, query=("path",))
DESKTOP_LABELS = Endpoint("POST", "/api/desktops/{desktop_id}/labels", m.Desktop, body=("add", "remove"))
DESKTOP_EXEC = Endpoint(
    "POST", "/api/desktops/{desktop_id}/exec", m.ExecResult, body=("command", "argv", "timeout", "stdin")
)
DESKTOP_SCREENSHOT = Endpoint(
    "GET", "/api/desktops/{desktop_id}/screenshot", Binary, query=("format", "width")
)
DESKTOP_SCREEN = Endpoint("GET", "/api/desktops/{desktop_id}/screen", m.Screen)
DESKTOP_ACTIONS = Endpoint(
    "POST",
    "/api/desktops/{desktop_id}/actions",
    m.ScreenActionsDone,
    body=("actions", "screenshot", "format", "width"),
)
EGRESS_FIELDS = ("mode", "entries", "allow_llm_providers")
DESKTOP_EGRESS = Endpoint("GET", "/api/desktops/{desktop_id}/egress", m.Egress)
DESKTOP_EGRESS_SET = Endpoint("PUT", "/api/desktops/{desktop_id}/egress", m.Egress, body=EGRESS_FIELDS)
DESKTOP_EGRESS_INHERIT = Endpoint("DELETE", "/api/desktops/{desktop_id}/egress", m.Egress)
DESKTOP_BLOCKED = Endpoint("GET", "/api/desktops/{desktop_id}/blocked", m.BlockedAttempt, paged=True)
BULK_CREATE = Endpoint(
    "POST",
    "/api/desktops/bulk",
    m.BulkCreated,
    body=("names", "name_prefix", "count", "workspace_id", "plan", "image_profile", "labels"),
)
SELECTION = ("workspace_id", "ids", "labels", "state", "all_")
BULK_ACT = Endpoint("POST", "/api/desktops/bulk/{step}", m.BulkResult, body=SELECTION)
BULK_LABELS = Endpoint("POST", "/api/desktops/bulk/labels", m.BulkResult, body=(*SELECTION, "add", "remove"))

Progress = Callable[[m.Desktop], None]


class Desktops(Resource[M]):
    @streaming(DESKTOPS)
    def list(
        self,
        *,
        workspace_id: str | None = None,
        state: str | None = None,
        labels: Sequence[str] | None = None,
        name: str | None = None,
    ) -> Stream[m.Desktop]:
        """Every desktop you see (destroyed ones only when asked by state); `labels`: having all of them."""
        yield from pages(DESKTOPS.call(workspace_id=workspace_id, state=state, labels=labels, name=name))

    @operation(DESKTOP)
    def get(self, desktop_id: str) -> Plan[m.Desktop]:
        return (yield DESKTOP.call(desktop_id=desktop_id))

    @operation(DESKTOP, local=("states", "timeout", "on_progress", "interval"))
    def wait(
        self,
        desktop_id: str,
        states: tuple[str, ...] = STEADY,
        *,
        timeout: float = 900,
        on_progress: Progress | None = None,
        interval: float = 1.0,
    ) -> Plan[m.Desktop]:
        """Poll the desktop until it is in one of `states`; `on_progress` sees each change on the way."""
        return (yield from _wait(desktop_id, states, timeout, on_progress, interval))

    @operation(DESKTOP_CREATE, local=("wait", "timeout", "on_progress"))
    def create(
        self,
        name: str,
        *,
        workspace_id: str | None = None,
        plan: str | None = None,
        image_profile: str | None = None,
        labels: Sequence[str] | None = None,
        wait: bool = False,
        timeout: float = 900,
        on_progress: Progress | None = None,
    ) -> Plan[m.Desktop]:
        """A new desktop; with `wait`, once it is running (or in error), `on_progress` seeing each step."""
        call = DESKTOP_CREATE.call(
            name=name, workspace_id=workspace_id, plan=plan, image_profile=image_profile, labels=labels
        )
        desktop = yield call
        if wait:
            desktop = yield from _wait(desktop.id, ("running", "error"), timeout, on_progress)
        return desktop

    def _step(
        self, desktop_id: str, step: str, wait: bool, timeout: float, on_progress: Progress | None
    ) -> Plan:
        if step == "destroy":
            desktop = yield DESKTOP_DESTROY.call(desktop_id=desktop_id)
        else:
            desktop = yield DESKTOP_ACT.call(desktop_id=desktop_id, step=step)
        if wait:
            desktop = yield from _wait(desktop_id, STEADY, timeout, on_progress)
        return desktop

    @operation(DESKTOP_ACT, local=("wait", "timeout", "on_progress"), fixes=("step",))
    def start(
        self,
        desktop_id: str,
        *,
        wait: bool = False,
        timeout: float = 600,
        on_progress: Progress | None = None,
    ) -> Plan[m.Desktop]:
        return (yield from self._step(desktop_id, "start", wait, timeout, on_progress))

    @operation(DESKTOP_ACT, local=("wait", "timeout", "on_progress"), fixes=("step",))
    def stop(
        self,
        desktop_id: str,
        *,
        wait: bool = False,
        timeout: float = 600,
        on_progress: Progress | None = None,
    ) -> Plan[m.Desktop]:
        return (yield from self._step(desktop_id, "stop", wait, timeout, on_progress))

    @operation(DESKTOP_ACT, local=("wait", "timeout", "on_progress"), fixes=("step",))
    def suspend(
        self,
        desktop_id: str,
        *,
        wait: bool = False,
        timeout: float = 600,
        on_progress: Progress | None = None,
    ) -> Plan[m.Desktop]:
        return (yield from self._step(desktop_id, "suspend", wait, timeout, on_progress))

    @operation(DESKTOP_ACT, local=("wait", "timeout", "on_progress"), fixes=("step",))
    def resume(
        self,
        desktop_id: str,
        *,
        wait: bool = False,
        timeout: float = 600,
        on_progress: Progress | None = None,
    ) -> Plan[m.Desktop]:
        return (yield from self._step(desktop_id, "resume", wait, timeout, on_progress))

    @operation(DESKTOP_DESTROY, local=("wait", "timeout", "on_progress"))
    def destroy(
        self,
        desktop_id: str,
        *,
        wait: bool = False,
        timeout: float = 600,
        on_progress: Progress | None = None,
    ) -> Plan[m.Desktop]:
        """Destroy the desktop and its disk."""
        return (yield from self._step(desktop_id, "destroy", wait, timeout, on_progress))

    @streaming(DESKTOP_EVENTS)
    def events(self, desktop_id: str) -> Stream[m.DesktopEvent]:
        """Every state change of the desktop, oldest first, with who or what caused it."""
        yield from pages(DESKTOP_EVENTS.call(desktop_id=desktop_id))

    @operation(DESKTOP_USAGE)
    def usage(self, desktop_id: str) -> Plan[m.AgentUsage]:
        return (yield DESKTOP_USAGE.call(desktop_id=desktop_id))

    @operation(DESKTOP_COSTS)
    def costs(self, desktop_id: str, *, month: str | None = None) -> Plan[m.DesktopMonthCosts]:
        """The desktop's usage and cost in a month (YYYY-MM; this one by default), day by day."""
        return (yield DESKTOP_COSTS.call(desktop_id=desktop_id, month=month))

    @operation(DESKTOP_SESSIONS)
    def sessions(self, desktop_id: str, *, mode: str = "view") -> Plan[m.RelaySession]:
        """Single-use tickets opening the screen and terminal relays (WebSockets), in `view` or `control`."""
        return (yield DESKTOP_SESSIONS.call(desktop_id=desktop_id, mode=mode))

    @operation(DESKTOP_LABELS)
    def label(
        self, desktop_id: str, *, add: Sequence[str] | None = None, remove: Sequence[str] | None = None
    ) -> Plan[m.Desktop]:
        return (yield DESKTOP_LABELS.call(desktop_id=desktop_id, add=add, remove=remove))

    @operation(DESKTOP_SCREENSHOT)
    def screenshot(
        self, desktop_id: str, *, format: str = "png", width: int | None = None
    ) -> Plan[m.ScreenImage]:
        """The desktop's screen as PNG or JPEG bytes, scaled down to `width` if given."""
        answer = yield DESKTOP_SCREENSHOT.call(desktop_id=desktop_id, format=format, width=width)
        headers = answer.headers
        return m.ScreenImage(
            data=answer.content,
            content_type=answer.content_type,
            scale=float(headers["x-screenshot-scale"]),
            screen_width=int(headers["x-screen-width"]),
            screen_height=int(headers["x-screen-height"]),
        )

    @operation(DESKTOP_SCREEN)
    def screen(self, desktop_id: str) -> Plan[m.Screen]:
        """The screen's size, and where its pointer is when the desktop's screen says."""
        return (yield DESKTOP_SCREEN.call(desktop_id=desktop_id))

    @operation(DESKTOP_ACTIONS)
    def act(
        self,
        desktop_id: str,
        actions: Sequence[dict[str, Any]],
        *,
        screenshot: bool = False,
        format: str = "png",
        width: int | None = None,
    ) -> Plan[m.ScreenActionsDone]:
        """Input on the desktop's screen, in order, as the API spells it: `{"type": "click", "x": 10,
        "y": 20}`, `move`, `drag` (`toX`, `toY`), `scroll` (`dx`, `dy`), `type` (`text`), `key` (`keys`:
        `ctrl+l`), `wait` (`ms`). With `screenshot`, the screen once it has settled."""
        call = DESKTOP_ACTIONS.call(
            desktop_id=desktop_id, actions=list(actions), screenshot=screenshot, format=format, width=width
        )
        return (yield call)

    @operation(DESKTOP_EGRESS)
    def egress(self, desktop_id: str) -> Plan[m.Egress]:
        """Where the desktop may connect: its own policy, or its workspace's (`inherited`)."""
        return (yield DESKTOP_EGRESS.call(desktop_id=desktop_id))

    @operation(DESKTOP_EGRESS_SET)
    def set_egress(
        self,
        desktop_id: str,
        mode: str,
        *,
        entries: Sequence[str] | None = None,
        allow_llm_providers: bool | None = None,
    ) -> Plan[m.Egress]:
        """Give the desktop a policy of its own (admins); it applies within seconds, running or not."""
        call = DESKTOP_EGRESS_SET.call(
            desktop_id=desktop_id, mode=mode, entries=entries, allow_llm_providers=allow_llm_providers
        )
        return (yield call)

    @operation(DESKTOP_EGRESS_INHERIT)
    def inherit_egress(self, desktop_id: str) -> Plan[m.Egress]:
        """Drop the desktop's own policy: it follows its workspace's again."""
        return (yield DESKTOP_EGRESS_INHERIT.call(desktop_id=desktop_id))

    @streaming(DESKTOP_BLOCKED)
    def blocked(self, desktop_id: str) -> Stream[m.BlockedAttempt]:
        """What the desktop tried to reach and its egress policy refused, the latest attempt first."""
        yield from pages(DESKTOP_BLOCKED.call(desktop_id=desktop_id))

    @operation(DESKTOP_FILE_GET)
    def download(self, desktop_id: str, path: str) -> Plan[Binary]:
        """A file of the desktop (`path` in its agent's home), or a folder of it as a zip (its name in the
        Content-Disposition header)."""
        return (yield DESKTOP_FILE_GET.call(desktop_id=desktop_id, path=path))

    @operation(DESKTOP_FILE_PUT, local=("content",))
    def upload(self, desktop_id: str, path: str, content: bytes) -> Plan[m.FileWritten]:
        """Write `content` as a file of the desktop (`path` in its agent's home, folders made as needed)."""
        return (
            yield dataclasses.replace(
                DESKTOP_FILE_PUT.call(desktop_id=desktop_id, path=path), content=content
            )
        )

    @operation(DESKTOP_EXEC)
    def exec(
        self,
        desktop_id: str,
        command: str | None = None,
        *,
        argv: Sequence[str] | None = None,
        timeout: int = 60,
        stdin: str | None = None,
    ) -> Plan[m.ExecResult]:
        """Run a shell command line (or `argv`, passed as it is) in the desktop as its agent user."""
        return (
            yield DESKTOP_EXEC.call(
                desktop_id=desktop_id, command=command, argv=argv, timeout=timeout, stdin=stdin
            )
        )

    @operation(BULK_CREATE, local=("wait", "timeout", "on_progress"))
    def bulk_create(
        self,
        *,
        names: Sequence[str] | None = None,
        name_prefix: str | None = None,
        count: int | None = None,
        workspace_id: str | None = None,
        plan: str | None = None,
        image_profile: str | None = None,
        labels: Sequence[str] | None = None,
        wait: bool = False,
        timeout: float = 1800,
        on_progress: Progress | None = None,
    ) -> Plan[builtins.list[m.Desktop]]:
        """Many desktops, all or none (a quota counts the whole batch): `names`, or `name_prefix` and
        `count` (numbered on from the highest in use); with `wait`, once each is running or in error."""
        made = yield BULK_CREATE.call(
            names=names,
            name_prefix=name_prefix,
            count=count,
            workspace_id=workspace_id,
            plan=plan,
            image_profile=image_profile,
            labels=labels,
        )
        if not wait:
            return made.desktops
        deadline, desktops = time.monotonic() + timeout, []
        for desktop in made.desktops:
            desktops.append(
                (yield from _wait(desktop.id, ("running", "error"), deadline - time.monotonic(), on_progress))
            )
        return desktops

    @operation(BULK_ACT)
    def bulk(
        self,
        step: str,
        *,
        workspace_id: str | None = None,
        ids: Sequence[str] | None = None,
        labels: Sequence[str] | None = None,
        state: str | None = None,
        all_: bool | None = None,
    ) -> Plan[m.BulkResult]:
        """`step` (start, stop, suspend, resume, destroy) on each desktop of the workspace selected by
        ids, labels (all of them), state, or `all_`; each answered on its own."""
        return (
            yield BULK_ACT.call(
                step=step, workspace_id=workspace_id, ids=ids, labels=labels, state=state, all_=all_
            )
        )

    @operation(BULK_LABELS)
    def bulk_label(
        self,
        *,
        add: Sequence[str] | None = None,
        remove: Sequence[str] | None = None,
        workspace_id: str | None = None,
        ids: Sequence[str] | None = None,
        labels: Sequence[str] | None = None,
        state: str | None = None,
        all_: bool | None = None,
    ) -> Plan[m.BulkResult]:
        """Add and remove labels on each selected desktop (selected as for `bulk`)."""
        call = BULK_LABELS.call(
            add=add, remove=remove, workspace_id=workspace_id, ids=ids, labels=labels, state=state, all_=all_
        )
        return (yield call)


def _wait(
    desktop_id: str,
    states: tuple[str, ...],
    timeout: float,
    on_progress: Progress | None,
    interval: float = 1.0,
) -> Plan[m.Desktop]:
    deadline, seen = time.monotonic() + timeout, None
    while True:
        desktop = yield DESKTOP.call(desktop_id=desktop_id)
        if on_progress and (desktop.state, desktop.last_error) != seen:
            on_progress(desktop)
        seen = (desktop.state, desktop.last_error)
        if desktop.state in states:
            return desktop
        if time.monotonic() > deadline:
            raise WaitTimeout(f"{desktop_id} is still {desktop.state} after {timeout:.0f} s")
        yield Sleep(interval)


# Chat

CHAT = Endpoint("GET", "/api/desktops/{desktop_id}/chat", m.ChatMessage, paged=True)
CHAT_SEND = Endpoint("POST", "/api/desktops/{desktop_id}/chat", m.ChatMessage, body=("message",))
CHAT_MESSAGE = Endpoint("GET", "/api/desktops/{desktop_id}/chat/{message_id}", m.ChatMessage)
CHAT_CANCEL = Endpoint("POST", "/api/desktops/{desktop_id}/chat/{message_id}/cancel", m.ChatMessage)


class Chat(Resource[M]):
    """The conversation with a desktop's agent.

    An answer grows while the agent works: `stream` polls the reply (`GET …/chat/{message_id}`) and emits
    what each poll adds. Mission Control's pages follow a server-sent event stream instead, but that
    stream belongs to the browser session; a key-authenticated client polls one small message.
    """

    @streaming(CHAT)
    def list(self, desktop_id: str) -> Stream[m.ChatMessage]:
        yield from pages(CHAT.call(desktop_id=desktop_id))

    @operation(CHAT_SEND)
    def send(self, desktop_id: str, message: str) -> Plan[m.ChatMessage]:
        """Send a message; the answer to come (status queued), which `get` or `wait` follow."""
        return (yield CHAT_SEND.call(desktop_id=desktop_id, message=message))

    @operation(CHAT_MESSAGE)
    def get(self, desktop_id: str, message_id: str) -> Plan[m.ChatMessage]:
        return (yield CHAT_MESSAGE.call(desktop_id=desktop_id, message_id=message_id))

    @operation(CHAT_CANCEL)
    def cancel(self, desktop_id: str, message_id: str) -> Plan[m.ChatMessage]:
        """Cancel a turn: a queued one never starts, a running one is stopped in the desktop."""
        return (yield CHAT_CANCEL.call(desktop_id=desktop_id, message_id=message_id))

    @streaming(CHAT_MESSAGE, local=("interval", "timeout"))
    def follow(
        self, desktop_id: str, message_id: str, *, interval: float = 0.5, timeout: float = 3600
    ) -> Stream[m.ChatPiece]:
        """Emit an answer's pieces as they come, until it is done or in error."""
        yield from _follow(desktop_id, message_id, interval, timeout)

    @streaming(CHAT_SEND, local=("interval", "timeout"))
    def stream(
        self, desktop_id: str, message: str, *, interval: float = 0.5, timeout: float = 3600
    ) -> Stream[m.ChatPiece]:
        """Send a message and emit the answer's pieces as they come."""
        reply = yield CHAT_SEND.call(desktop_id=desktop_id, message=message)
        yield from _follow(desktop_id, reply.id, interval, timeout)

    @operation(CHAT_SEND, local=("interval", "timeout"))
    def ask(
        self, desktop_id: str, message: str, *, interval: float = 0.5, timeout: float = 3600
    ) -> Plan[m.ChatMessage]:
        """Send a message and return the whole answer once it is done (or in error)."""
        reply = yield CHAT_SEND.call(desktop_id=desktop_id, message=message)
        deadline = time.monotonic() + timeout
        while not reply.finished:
            if time.monotonic() > deadline:
                raise WaitTimeout(f"no answer to {reply.id} after {timeout:.0f} s")
            yield Sleep(interval)
            reply = yield CHAT_MESSAGE.call(desktop_id=desktop_id, message_id=reply.id)
        return reply


def _follow(desktop_id: str, message_id: str, interval: float, timeout: float) -> Stream[m.ChatPiece]:
    deadline, shown = time.monotonic() + timeout, ""
    while True:
        reply = yield CHAT_MESSAGE.call(desktop_id=desktop_id, message_id=message_id)
        text = _new_text(shown, reply.content)
        if text or reply.finished:
            yield Emit(m.ChatPiece(text, reply))
            shown += text
        if reply.finished:
            return
        if time.monotonic() > deadline:
            raise WaitTimeout(f"no answer to {message_id} after {timeout:.0f} s")
        yield Sleep(interval)


def _new_text(shown: str, content: str) -> str:
    """What `content` adds to what was shown. A finished answer is stored trimmed, and one in error ends
    with why: its text then starts with what was shown, trimmed."""
    for prefix in (shown, shown.strip()):
        if content.startswith(prefix):
            return content[len(prefix) :]
    return "\n" + content


# Scheduled messages

SCHEDULES = Endpoint("GET", "/api/desktops/{desktop_id}/schedules", m.Schedule, paged=True)
SCHEDULE_FIELDS = ("cron", "message", "timezone", "stop_after", "enabled")
SCHEDULE_CREATE = Endpoint("POST", "/api/desktops/{desktop_id}/schedules", m.Schedule, body=SCHEDULE_FIELDS)
SCHEDULE = Endpoint("GET", "/api/schedules/{schedule_id}", m.Schedule)
SCHEDULE_UPDATE = Endpoint("PATCH", "/api/schedules/{schedule_id}", m.Schedule, body=SCHEDULE_FIELDS)
SCHEDULE_DELETE = Endpoint("DELETE", "/api/schedules/{schedule_id}")
SCHEDULE_RUNS = Endpoint("GET", "/api/schedules/{schedule_id}/runs", m.ScheduleRun, paged=True)


class Schedules(Resource[M]):
    """Messages sent to a desktop's agent on a cron schedule, as their author; the desktop is started first
    if need be, and stopped after the answer with `stop_after`."""

    @streaming(SCHEDULES)
    def list(self, desktop_id: str) -> Stream[m.Schedule]:
        yield from pages(SCHEDULES.call(desktop_id=desktop_id))

    @operation(SCHEDULE_CREATE)
    def create(
        self,
        desktop_id: str,
        cron: str,
        message: str,
        *,
        timezone: str | None = None,
        stop_after: bool | None = None,
        enabled: bool | None = None,
    ) -> Plan[m.Schedule]:
        """`cron`: minute hour day month weekday (e.g. `0 9 * * 1-5`), in `timezone` (UTC by default)."""
        call = SCHEDULE_CREATE.call(
            desktop_id=desktop_id,
            cron=cron,
            message=message,
            timezone=timezone,
            stop_after=stop_after,
            enabled=enabled,
        )
        return (yield call)

    @operation(SCHEDULE)
    def get(self, schedule_id: str) -> Plan[m.Schedule]:
        return (yield SCHEDULE.call(schedule_id=schedule_id))

    @operation(SCHEDULE_UPDATE)
    def update(
        self,
        schedule_id: str,
        *,
        cron: str | None = None,
        message: str | None = None,
        timezone: str | None = None,
        stop_after: bool | None = None,
        enabled: bool | None = None,
    ) -> Plan[m.Schedule]:
        """Change what is given; the schedule then sends its messages as you."""
        call = SCHEDULE_UPDATE.call(
            schedule_id=schedule_id,
            cron=cron,
            message=message,
            timezone=timezone,
            stop_after=stop_after,
            enabled=enabled,
        )
        return (yield call)

    @operation(SCHEDULE_DELETE)
    def delete(self, schedule_id: str) -> Plan[None]:
        return (yield SCHEDULE_DELETE.call(schedule_id=schedule_id))

    @streaming(SCHEDULE_RUNS)
    def runs(self, schedule_id: str) -> Stream[m.ScheduleRun]:
        """The times it came due, newest first."""
        yield from pages(SCHEDULE_RUNS.call(schedule_id=schedule_id))


# Workspaces, their members, usage and costs

WORKSPACES = Endpoint("GET", "/api/workspaces", m.Workspace, paged=True)
WORKSPACE_CREATE = Endpoint("POST", "/api/workspaces", m.Workspace, body=("name",))
WORKSPACE = Endpoint("GET", "/api/workspaces/{workspace_id}", m.Workspace)
WORKSPACE_UPDATE = Endpoint(
    "PATCH",
    "/api/workspaces/{workspace_id}",
    m.Workspace,
    body=(
        "name",
        "agent_command",
        "control_role",
        "approval_role",
        "approval_timeout",
        "alert_thresholds",
        "approval_commands",
    ),
)
WORKSPACE_DELETE = Endpoint("DELETE", "/api/workspaces/{workspace_id}")
WEBHOOK = Endpoint("GET", "/api/workspaces/{workspace_id}/webhook", m.Webhook)
WEBHOOK_SET = Endpoint(
    "PUT", "/api/workspaces/{workspace_id}/webhook", m.Webhook, body=("url", "rotate_secret")
)
WEBHOOK_DELIVERIES = Endpoint(
    "GET", "/api/workspaces/{workspace_id}/webhook/deliveries", m.WebhookDelivery, paged=True
)
WORKSPACE_USAGE = Endpoint("GET", "/api/workspaces/{workspace_id}/usage", m.WorkspaceUsage)
WORKSPACE_COSTS = Endpoint("GET", "/api/workspaces/{workspace_id}/costs", m.MonthCosts, query=("month",))
WORKSPACE_QUOTA = Endpoint("GET", "/api/workspaces/{workspace_id}/quota", m.QuotaUsage)
WORKSPACE_LABELS = Endpoint("GET", "/api/workspaces/{workspace_id}/labels", m.LabelCount, paged=True)
WORKSPACE_EGRESS = Endpoint("GET", "/api/workspaces/{workspace_id}/egress", m.Egress)
WORKSPACE_EGRESS_SET = Endpoint("PUT", "/api/workspaces/{workspace_id}/egress", m.Egress, body=EGRESS_FIELDS)
MEMBERS = Endpoint("GET", "/api/workspaces/{workspace_id}/members", m.Membership, paged=True)
MEMBER_UPDATE = Endpoint(
    "PATCH", "/api/workspaces/{workspace_id}/members/{membership_id}", m.Membership, body=("role",)
)
MEMBER_REMOVE = Endpoint("DELETE", "/api/workspaces/{workspace_id}/members/{membership_id}")
WORKSPACE_INVITATIONS = Endpoint(
    "GET", "/api/workspaces/{workspace_id}/invitations", m.Invitation, paged=True
)
INVITE = Endpoint("POST", "/api/workspaces/{workspace_id}/invitations", m.Invitation, body=("email", "role"))
INVITATION_WITHDRAW = Endpoint("DELETE", "/api/workspaces/{workspace_id}/invitations/{invitation_id}")
MODEL_PRICES = Endpoint("GET", "/api/workspaces/{workspace_id}/model-prices", m.ModelPrice, paged=True)
MODEL_PRICE_SET = Endpoint(
    "POST",
    "/api/workspaces/{workspace_id}/model-prices",
    m.ModelPrice,
    body=("model", "input_per_million", "output_per_million"),
)
MODEL_PRICE_DELETE = Endpoint("DELETE", "/api/workspaces/{workspace_id}/model-prices/{price_id}")


class Workspaces(Resource[M]):
    @streaming(WORKSPACES)
    def list(self) -> Stream[m.Workspace]:
        yield from pages(WORKSPACES.call())

    @operation(WORKSPACE_CREATE)
    def create(self, name: str) -> Plan[m.Workspace]:
        """A new workspace (signed-in people only: an API key belongs to its one workspace)."""
        return (yield WORKSPACE_CREATE.call(name=name))

    @operation(WORKSPACE)
    def get(self, workspace_id: str) -> Plan[m.Workspace]:
        return (yield WORKSPACE.call(workspace_id=workspace_id))

    @operation(WORKSPACE_UPDATE)
    def update(
        self,
        workspace_id: str,
        *,
        name: str | None = None,
        agent_command: str | None = None,
        control_role: str | None = None,
        approval_role: str | None = None,
        approval_timeout: int | None = None,
        alert_thresholds: Mapping[str, int] | None = None,
        approval_commands: list[str] | None = None,
    ) -> Plan[m.Workspace]:
        """Change what is given; `alert_thresholds` changes those it names (`memory_percent`: 80);
        `approval_commands`: what the agent (OpenClaw) runs only once approved, e.g. ["git push"]."""
        call = WORKSPACE_UPDATE.call(
            workspace_id=workspace_id,
            name=name,
            agent_command=agent_command,
            control_role=control_role,
            approval_role=approval_role,
            approval_timeout=approval_timeout,
            alert_thresholds=alert_thresholds,
            approval_commands=approval_commands,
        )
        return (yield call)

    @operation(WORKSPACE_DELETE)
    def delete(self, workspace_id: str) -> Plan[None]:
        return (yield WORKSPACE_DELETE.call(workspace_id=workspace_id))

    @operation(WEBHOOK)
    def webhook(self, workspace_id: str) -> Plan[m.Webhook]:
        return (yield WEBHOOK.call(workspace_id=workspace_id))

    @operation(WEBHOOK_SET)
    def set_webhook(
        self, workspace_id: str, url: str, *, rotate_secret: bool | None = None
    ) -> Plan[m.Webhook]:
        """Where approval events are POSTed, signed; keep the secret of the answer, it is shown once."""
        return (yield WEBHOOK_SET.call(workspace_id=workspace_id, url=url, rotate_secret=rotate_secret))

    @streaming(WEBHOOK_DELIVERIES)
    def webhook_deliveries(self, workspace_id: str) -> Stream[m.WebhookDelivery]:
        yield from pages(WEBHOOK_DELIVERIES.call(workspace_id=workspace_id))

    @operation(WORKSPACE_USAGE)
    def usage(self, workspace_id: str) -> Plan[m.WorkspaceUsage]:
        """The agents' model usage: the total and each desktop's."""
        return (yield WORKSPACE_USAGE.call(workspace_id=workspace_id))

    @operation(WORKSPACE_COSTS)
    def costs(self, workspace_id: str, *, month: str | None = None) -> Plan[m.MonthCosts]:
        """The month's usage and costs (YYYY-MM; this one by default): per day, per desktop, owed."""
        return (yield WORKSPACE_COSTS.call(workspace_id=workspace_id, month=month))

    @operation(WORKSPACE_QUOTA)
    def quota(self, workspace_id: str) -> Plan[m.QuotaUsage]:
        return (yield WORKSPACE_QUOTA.call(workspace_id=workspace_id))

    @operation(WORKSPACE_EGRESS)
    def egress(self, workspace_id: str) -> Plan[m.Egress]:
        """Where the workspace's desktops may connect (but those with a policy of their own)."""
        return (yield WORKSPACE_EGRESS.call(workspace_id=workspace_id))

    @operation(WORKSPACE_EGRESS_SET)
    def set_egress(
        self,
        workspace_id: str,
        mode: str,
        *,
        entries: Sequence[str] | None = None,
        allow_llm_providers: bool | None = None,
    ) -> Plan[m.Egress]:
        """Set the workspace's policy (admins); running desktops follow it within seconds."""
        call = WORKSPACE_EGRESS_SET.call(
            workspace_id=workspace_id, mode=mode, entries=entries, allow_llm_providers=allow_llm_providers
        )
        return (yield call)

    @streaming(WORKSPACE_LABELS)
    def labels(self, workspace_id: str) -> Stream[m.LabelCount]:
        """The labels on the workspace's desktops, with how many desktops have each."""
        yield from pages(WORKSPACE_LABELS.call(workspace_id=workspace_id))

    @streaming(MEMBERS)
    def members(self, workspace_id: str) -> Stream[m.Membership]:
        yield from pages(MEMBERS.call(workspace_id=workspace_id))

    @operation(MEMBER_UPDATE)
    def set_role(self, workspace_id: str, membership_id: str, role: str) -> Plan[m.Membership]:
        return (yield MEMBER_UPDATE.call(workspace_id=workspace_id, membership_id=membership_id, role=role))

    @operation(MEMBER_REMOVE)
    def remove_member(self, workspace_id: str, membership_id: str) -> Plan[None]:
        return (yield MEMBER_REMOVE.call(workspace_id=workspace_id, membership_id=membership_id))

    @streaming(WORKSPACE_INVITATIONS)
    def invitations(self, workspace_id: str) -> Stream[m.Invitation]:
        yield from pages(WORKSPACE_INVITATIONS.call(workspace_id=workspace_id))

    @operation(INVITE)
    def invite(self, workspace_id: str, email: str, *, role: str | None = None) -> Plan[m.Invitation]:
        return (yield INVITE.call(workspace_id=workspace_id, email=email, role=role))

    @operation(INVITATION_WITHDRAW)
    def withdraw_invitation(self, workspace_id: str, invitation_id: str) -> Plan[None]:
        return (yield INVITATION_WITHDRAW.call(workspace_id=workspace_id, invitation_id=invitation_id))

    @streaming(MODEL_PRICES)
    def model_prices(self, workspace_id: str) -> Stream[m.ModelPrice]:
        yield from pages(MODEL_PRICES.call(workspace_id=workspace_id))

    @operation(MODEL_PRICE_SET)
    def set_model_price(
        self, workspace_id: str, model: str, input_per_million: Decimal, output_per_million: Decimal
    ) -> Plan[m.ModelPrice]:
        call = MODEL_PRICE_SET.call(
            workspace_id=workspace_id,
            model=model,
            input_per_million=input_per_million,
            output_per_million=output_per_million,
        )
        return (yield call)

    @operation(MODEL_PRICE_DELETE)
    def delete_model_price(self, workspace_id: str, price_id: str) -> Plan[None]:
        return (yield MODEL_PRICE_DELETE.call(workspace_id=workspace_id, price_id=price_id))


# Invitations to you

INVITATIONS = Endpoint("GET", "/api/invitations", m.Invitation, paged=True)
INVITATION_ACCEPT = Endpoint("POST", "/api/invitations/{invitation_id}/accept", m.Membership)
INVITATION_DECLINE = Endpoint("POST", "/api/invitations/{invitation_id}/decline")


class Invitations(Resource[M]):
    """Invitations to your confirmed addresses (signed-in people only, not API keys)."""

    @streaming(INVITATIONS)
    def list(self) -> Stream[m.Invitation]:
        yield from pages(INVITATIONS.call())

    @operation(INVITATION_ACCEPT)
    def accept(self, invitation_id: str) -> Plan[m.Membership]:
        return (yield INVITATION_ACCEPT.call(invitation_id=invitation_id))

    @operation(INVITATION_DECLINE)
    def decline(self, invitation_id: str) -> Plan[None]:
        return (yield INVITATION_DECLINE.call(invitation_id=invitation_id))


# Keys

KEYS = Endpoint("GET", "/api/keys", m.ApiKey, query=("workspace_id:workspace",), paged=True)
KEY_CREATE = Endpoint(
    "POST", "/api/keys", m.ApiKeyCreated, body=("name", "workspace_id", "scope", "expires_at")
)
KEY_REVOKE = Endpoint("DELETE", "/api/keys/{key_id}")


class Keys(Resource[M]):
    """Platform API keys (`lb_…`), which admins manage."""

    @streaming(KEYS)
    def list(self, *, workspace_id: str | None = None) -> Stream[m.ApiKey]:
        yield from pages(KEYS.call(workspace_id=workspace_id))

    @operation(KEY_CREATE)
    def create(
        self,
        name: str,
        *,
        workspace_id: str | None = None,
        scope: str | None = None,
        expires_at: datetime | None = None,
    ) -> Plan[m.ApiKeyCreated]:
        """A new key; its secret (`key`) is shown this once."""
        return (
            yield KEY_CREATE.call(name=name, workspace_id=workspace_id, scope=scope, expires_at=expires_at)
        )

    @operation(KEY_REVOKE)
    def revoke(self, key_id: str) -> Plan[None]:
        return (yield KEY_REVOKE.call(key_id=key_id))


LLM_KEY_FIELDS = ("provider", "name", "secret", "base_url", "model")
LLM_KEYS = Endpoint("GET", "/api/llm-keys", m.LLMKey, query=("workspace_id:workspace",), paged=True)
LLM_KEY_CREATE = Endpoint("POST", "/api/llm-keys", m.LLMKey, body=(*LLM_KEY_FIELDS, "workspace_id"))
LLM_KEY = Endpoint("GET", "/api/llm-keys/{key_id}", m.LLMKey)
LLM_KEY_ROTATE = Endpoint("PUT", "/api/llm-keys/{key_id}", m.LLMKey, body=(*LLM_KEY_FIELDS, "workspace_id"))
LLM_KEY_DELETE = Endpoint("DELETE", "/api/llm-keys/{key_id}")


class LLMKeys(Resource[M]):
    """The workspace's own model provider keys (BYOK), which its desktops' agents use."""

    @streaming(LLM_KEYS)
    def list(self, *, workspace_id: str | None = None) -> Stream[m.LLMKey]:
        yield from pages(LLM_KEYS.call(workspace_id=workspace_id))

    @operation(LLM_KEY)
    def get(self, key_id: str) -> Plan[m.LLMKey]:
        return (yield LLM_KEY.call(key_id=key_id))

    @operation(LLM_KEY_CREATE)
    def create(
        self,
        provider: str,
        name: str,
        secret: str,
        *,
        base_url: str | None = None,
        model: str | None = None,
        workspace_id: str | None = None,
    ) -> Plan[m.LLMKey]:
        call = LLM_KEY_CREATE.call(
            provider=provider,
            name=name,
            secret=secret,
            base_url=base_url,
            model=model,
            workspace_id=workspace_id,
        )
        return (yield call)

    @operation(LLM_KEY_ROTATE)
    def rotate(
        self,
        key_id: str,
        provider: str,
        name: str,
        secret: str,
        *,
        base_url: str | None = None,
        model: str | None = None,
        workspace_id: str | None = None,
    ) -> Plan[m.LLMKey]:
        """Replace the key's secret (and its name, base URL or model)."""
        call = LLM_KEY_ROTATE.call(
            key_id=key_id,
            provider=provider,
            name=name,
            secret=secret,
            base_url=base_url,
            model=model,
            workspace_id=workspace_id,
        )
        return (yield call)

    @operation(LLM_KEY_DELETE)
    def delete(self, key_id: str) -> Plan[None]:
        return (yield LLM_KEY_DELETE.call(key_id=key_id))


# Plans, tiers and the audit trail

PLANS = Endpoint("GET", "/api/plans", m.Plan, paged=True)
PLAN = Endpoint("GET", "/api/plans/{plan_id}", m.Plan)
TIERS = Endpoint("GET", "/api/tiers", m.Tier, paged=True)
AUDIT = Endpoint(
    "GET",
    "/api/audit",
    m.AuditEvent,
    query=("workspace_id:workspace", "actor", "action", "target", "since", "until"),
    paged=True,
)


class Plans(Resource[M]):
    @streaming(PLANS)
    def list(self) -> Stream[m.Plan]:
        yield from pages(PLANS.call())

    @operation(PLAN)
    def get(self, plan_id: str) -> Plan[m.Plan]:
        return (yield PLAN.call(plan_id=plan_id))


class Tiers(Resource[M]):
    @streaming(TIERS)
    def list(self) -> Stream[m.Tier]:
        yield from pages(TIERS.call())


class Audit(Resource[M]):
    @streaming(AUDIT)
    def list(
        self,
        *,
        workspace_id: str | None = None,
        actor: str | None = None,
        action: str | None = None,
        target: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> Stream[m.AuditEvent]:
        """What people did in the workspace, newest first (admins); `action` matches a prefix."""
        call = AUDIT.call(
            workspace_id=workspace_id, actor=actor, action=action, target=target, since=since, until=until
        )
        yield from pages(call)


# Approvals

APPROVALS = Endpoint(
    "GET",
    "/api/approvals",
    m.Approval,
    query=("workspace_id:workspace", "desktop_id:desktop", "status"),
    paged=True,
)
APPROVAL = Endpoint("GET", "/api/approvals/{approval_id}", m.Approval)
APPROVAL_APPROVE = Endpoint("POST", "/api/approvals/{approval_id}/approve", m.Approval, body=("comment",))
APPROVAL_DENY = Endpoint("POST", "/api/approvals/{approval_id}/deny", m.Approval, body=("comment",))
APPROVAL_SCREENSHOT = Endpoint("GET", "/api/approvals/{approval_id}/screenshot", Binary)


class Approvals(Resource[M]):
    """Agents' requests for approval, asked from their desktops; the first answer stands."""

    @streaming(APPROVALS)
    def list(
        self, *, workspace_id: str | None = None, desktop_id: str | None = None, status: str | None = None
    ) -> Stream[m.Approval]:
        """Newest first; `status="pending"` is the queue waiting for an answer."""
        yield from pages(APPROVALS.call(workspace_id=workspace_id, desktop_id=desktop_id, status=status))

    @operation(APPROVAL)
    def get(self, approval_id: str) -> Plan[m.Approval]:
        return (yield APPROVAL.call(approval_id=approval_id))

    @operation(APPROVAL_SCREENSHOT)
    def screenshot(self, approval_id: str) -> Plan[Binary]:
        """The asking desktop's screen as it asked (a JPEG), when one could be taken."""
        return (yield APPROVAL_SCREENSHOT.call(approval_id=approval_id))

    @operation(APPROVAL_APPROVE)
    def approve(self, approval_id: str, *, comment: str | None = None) -> Plan[m.Approval]:
        return (yield APPROVAL_APPROVE.call(approval_id=approval_id, comment=comment))

    @operation(APPROVAL_DENY)
    def deny(self, approval_id: str, *, comment: str | None = None) -> Plan[m.Approval]:
        return (yield APPROVAL_DENY.call(approval_id=approval_id, comment=comment))


# Alerts

ALERTS = Endpoint(
    "GET",
    "/api/alerts",
    m.Alert,
    query=("workspace_id:workspace", "desktop_id:desktop", "status", "kind"),
    paged=True,
)
ALERT = Endpoint("GET", "/api/alerts/{alert_id}", m.Alert)
ALERT_ACKNOWLEDGE = Endpoint("POST", "/api/alerts/{alert_id}/acknowledge", m.Alert)


class Alerts(Resource[M]):
    """What the alert rules found on the desktops; each stays open until someone acknowledges it."""

    @streaming(ALERTS)
    def list(
        self,
        *,
        workspace_id: str | None = None,
        desktop_id: str | None = None,
        status: str | None = None,
        kind: str | None = None,
    ) -> Stream[m.Alert]:
        """Newest first; `status="open"` is what nobody has seen to yet."""
        call = ALERTS.call(workspace_id=workspace_id, desktop_id=desktop_id, status=status, kind=kind)
        yield from pages(call)

    @operation(ALERT)
    def get(self, alert_id: str) -> Plan[m.Alert]:
        return (yield ALERT.call(alert_id=alert_id))

    @operation(ALERT_ACKNOWLEDGE)
    def acknowledge(self, alert_id: str) -> Plan[m.Alert]:
        """Say you have seen to it (the role that may take control of desktops); once."""
        return (yield ALERT_ACKNOWLEDGE.call(alert_id=alert_id))
