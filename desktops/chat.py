"""The agent bridge, worker side: hand an operator's message to the agent runtime in the desktop
and stream its answer back as it comes.

Each turn runs detached inside the desktop (`bureau chat run`), so it outlives the worker that
started it. The worker follows its output over SSH, storing it with its byte offset and
publishing each piece to the open pages. A worker that dies leaves a stale heartbeat; then
`chat_resume` hands the turn to another worker, which follows on from the stored offset.
A desktop runs one turn at a time: later messages wait, queued, in the order they came. An operator
may cancel a turn, queued or running: a running one is stopped in the desktop, its whole process tree.
"""

from __future__ import annotations

import codecs
import json
import logging
import select
import shlex
import time
import uuid
from datetime import timedelta

import paramiko
from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone
from django.utils.translation import gettext as _

from desktops.audit import Actor, audit_record
from desktops.errors import Conflict, NotFound
from desktops.events import ChatUpdated, publish_chat_update
from desktops.guest import desktop_ssh_connect
from desktops.models import ChatChunk, ChatMessage, Desktop, DesktopState, Workspace
from desktops.queue import CHAT_STOP, enqueue
from desktops.selectors import chat_content, workspace_for_control

logger = logging.getLogger(__name__)
Status = ChatMessage.Status
# Shells answer 127 for a command they cannot find; `bureau chat run` 125 for a turn that vanished.
NOT_FOUND = 127
LOST = 125
# How often the follower saves what it has, at most.
FLUSH_SECONDS = 0.2
RUNS_DIR = ".local/state/bureau/chat"


class Superseded(Exception):
    """Another follower has taken the turn over (this one was thought dead): stop writing."""


class TurnTimeout(Exception):
    """The turn has run for longer than CHAT_TURN_TIMEOUT since its message was sent."""


def heartbeat_seconds() -> float:
    # Well inside the staleness limit, so a live follower is never taken for a dead one.
    return min(5.0, settings.CHAT_STALE_AFTER / 3)


def agent_command(template: str, *, session: str, message: str) -> str:
    return template.format(session=shlex.quote(session), message=shlex.quote(message))


def chat_claim_next(*, desktop_id: str) -> ChatMessage | None:
    """Start the desktop's oldest queued turn, unless one is running or its workspace has as many
    turns running as it may; the claimed reply, or None."""
    with transaction.atomic():
        workspace_id = Desktop.objects.filter(id=desktop_id).values_list("workspace_id", flat=True).first()
        # Claims in one workspace take turns on its row: two workers never both see a free slot.
        if workspace_id is None or not Workspace.objects.select_for_update().filter(id=workspace_id).exists():
            return None
        running = ChatMessage.objects.filter(desktop__workspace_id=workspace_id, status=Status.RUNNING)
        if running.filter(desktop_id=desktop_id).exists():
            return None
        if running.count() >= settings.CHAT_TURNS_PER_WORKSPACE:
            return None  # the turn stays queued; the next one to finish in the workspace hands it on
        queued = ChatMessage.objects.select_related("desktop").filter(
            desktop_id=desktop_id, status=Status.QUEUED
        )
        reply = queued.order_by("created_at").first()
        if reply is None:
            return None
        reply.status, reply.follower = Status.RUNNING, uuid.uuid4()
        reply.heartbeat_at = reply.started_at = timezone.now()
        # Conditional on its being queued still: a turn cancelled meanwhile never starts.
        if not queued.filter(id=reply.id).update(
            status=reply.status,
            heartbeat_at=reply.heartbeat_at,
            started_at=reply.started_at,
            follower=reply.follower,
        ):
            return None
        _publish(reply, at=0, text="")
    return reply


def chat_waiting(*, workspace_id: str) -> list[str]:
    """The workspace's desktops with a turn queued and none running, oldest message first."""
    running = ChatMessage.objects.filter(desktop_id=OuterRef("desktop_id"), status=Status.RUNNING)
    queued = ChatMessage.objects.filter(desktop__workspace_id=workspace_id, status=Status.QUEUED)
    waiting = queued.exclude(Exists(running)).order_by("created_at").values_list("desktop_id", flat=True)
    return list(dict.fromkeys(waiting))


def chat_resume() -> tuple[list[tuple[str, str]], list[str]]:
    """Turns nobody follows any more (their worker died) and desktops whose queue stalled.

    Returns the (reply, new follower token) pairs now handed on, and the desktops to start a turn on.
    """
    now = timezone.now()
    orphans = []
    for reply_id, beat in ChatMessage.objects.filter(
        status=Status.RUNNING, heartbeat_at__lt=now - timedelta(seconds=settings.CHAT_STALE_AFTER)
    ).values_list("id", "heartbeat_at"):
        follower = uuid.uuid4()
        # Conditional on the beat we read: of two resumers, one wins; the old follower's token is void.
        if ChatMessage.objects.filter(id=reply_id, heartbeat_at=beat).update(
            heartbeat_at=now, follower=follower
        ):
            orphans.append((reply_id, str(follower)))
    running = ChatMessage.objects.filter(desktop_id=OuterRef("desktop_id"), status=Status.RUNNING)
    stalled = (
        ChatMessage.objects.filter(
            status=Status.QUEUED, created_at__lt=now - timedelta(seconds=settings.CHAT_STALE_AFTER)
        )
        .exclude(Exists(running))
        .values_list("desktop_id", flat=True)
        .distinct()
    )
    return orphans, list(stalled)


def chat_follow(*, message_id: str, follower: str) -> str | None:
    """Run (or rejoin) a claimed turn and stream its answer; the reply ends `done`, or `error` with why.

    Returns the workspace's id once the turn is over (a turn waiting in it may start). None when there
    was nothing to do, another follower has the turn, or the desktop could not be reached for now (the
    turn stays `running`, its heartbeat goes stale and `chat_resume` tries again).
    """
    reply = (
        ChatMessage.objects.select_related("desktop__workspace", "reply_to")
        .filter(id=message_id, status=Status.RUNNING, follower=follower)
        .first()
    )
    if reply is None:
        return None
    try:
        return reply.desktop.workspace_id if _run_turn(reply) else None
    except Superseded:
        logger.info("turn %s is followed elsewhere now; this follower stops", message_id)
        return None


def chat_cancel(*, actor: Actor, desktop: Desktop, message_id: str) -> ChatMessage:
    """Cancel a turn (given by the operator's message or by the agent's reply): a queued one never
    starts; a running one keeps what the agent said so far and is stopped in the desktop. Returns the
    reply. Stopping the agent is controlling the desktop: it takes the workspace's control role."""
    workspace_for_control(actor=actor, workspace_id=desktop.workspace_id)
    with transaction.atomic():
        message = ChatMessage.objects.filter(desktop=desktop, id=message_id).first()
        if message is None:
            raise NotFound(_("Message %(id)s not found.") % {"id": message_id})
        reply = message if message.author == ChatMessage.Author.AGENT else message.replies.first()
        # The row lock orders this against the follower's writes, which check that it still holds the turn.
        reply = reply and ChatMessage.objects.select_for_update().filter(id=reply.id).first()
        if reply is None or reply.status not in (Status.QUEUED, Status.RUNNING):
            raise Conflict(_("This turn has already ended."))
        was = reply.status
        reply.content, reply.status = chat_content(reply), Status.CANCELLED
        ChatMessage.objects.filter(id=reply.id).update(
            status=Status.CANCELLED, content=reply.content, follower=None, completed_at=timezone.now()
        )
        ChatChunk.objects.filter(message_id=reply.id).delete()
        audit_record(
            actor=actor,
            action="chat.cancel",
            workspace_id=desktop.workspace_id,
            target=desktop.id,
            message=reply.id,
            was=was,
        )
        enqueue(CHAT_STOP, message_id=reply.id, started=was == Status.RUNNING)
    _publish(reply, at=0, text=reply.content)
    return reply


def chat_stop(*, message_id: str, started: bool) -> str | None:
    """Stop a cancelled turn's processes in its desktop, if it had started; the workspace's id (the
    turn's slot is free)."""
    cancelled = ChatMessage.objects.filter(id=message_id, status=Status.CANCELLED)
    reply = cancelled.select_related("desktop").first()
    if reply is None:
        return None
    desktop = reply.desktop
    if started and desktop.state == DesktopState.RUNNING and desktop.private_ip:
        with desktop_ssh_connect(desktop_id=desktop.id, host=desktop.private_ip) as ssh:
            _, out, err = ssh.exec_command(f"bureau chat stop {shlex.quote(reply.id)}")
            if out.channel.recv_exit_status() != 0:
                why = err.read().decode(errors="replace")
                logger.warning("turn %s could not be stopped: %s", reply.id, why)
    return desktop.workspace_id


def _run_turn(reply: ChatMessage) -> bool:
    """Follow the turn to its end; False if the desktop could not be reached (try again later)."""
    desktop = reply.desktop
    if desktop.state != DesktopState.RUNNING:
        _finish(reply, f"The desktop is {desktop.state}: start it, then send the message again.", failed=True)
        return True
    template = desktop.workspace.agent_command
    command = agent_command(template, session=desktop.id, message=reply.reply_to.content)
    deadline = reply.created_at + timedelta(seconds=settings.CHAT_TURN_TIMEOUT)
    answer = _Answer(reply)
    usage: dict = {}
    try:
        with desktop_ssh_connect(desktop_id=desktop.id, host=desktop.private_ip) as ssh:
            ssh.get_transport().set_keepalive(15)  # notice a desktop that vanished mid-turn
            channel = ssh.get_transport().open_session()
            channel.exec_command(f"bureau chat run {shlex.quote(reply.id)} --offset {reply.output_offset}")
            channel.sendall(command.encode())
            channel.shutdown_write()
            try:
                status, errors = _stream(channel, answer, deadline)
            except TurnTimeout:
                ssh.exec_command(f"bureau chat stop {shlex.quote(reply.id)}")
                _finish(
                    reply,
                    f"No answer within {settings.CHAT_TURN_TIMEOUT} s: the agent was stopped.",
                    failed=True,
                    answer=answer,
                )
                return True
            usage = _usage(ssh, reply.id)
    except (paramiko.SSHException, OSError) as exc:
        status, errors = -1, str(exc)
    if status == -1:  # the connection broke, not the agent
        if timezone.now() < deadline:
            answer.save()  # where the next follower picks up
            logger.warning("lost the desktop of turn %s (%s); it will be picked up again", reply.id, errors)
            return False
        _finish(reply, f"The desktop's agent could not be reached: {errors}", failed=True, answer=answer)
        return True
    if status == 0:
        _finish(reply, answer.text.strip(), failed=False, usage=usage)
        return True
    if status == NOT_FOUND:
        program = shlex.split(template)[0]
        detail = errors.strip() or f"`{program}` is not installed there."
        why = f"This desktop has no agent runtime: {detail} Use the full image, or change the agent command."
    elif status == LOST:
        why = "The agent stopped without finishing (did the desktop restart?)."
    else:
        why = f"The agent stopped with status {status}: {errors.strip()[-2000:] or 'it gave no reason.'}"
    _finish(reply, why, failed=True, answer=answer, usage=usage)
    return True


def _stream(channel: paramiko.Channel, answer: _Answer, deadline) -> tuple[int, str]:
    """Feed the turn's output to `answer` as it comes; its exit status (-1: connection lost) and errors."""
    errors = bytearray()
    while True:
        if channel.recv_ready():
            answer.add(channel.recv(65536))
        elif channel.recv_stderr_ready():
            errors += channel.recv_stderr(65536)
        # The exit status may come before the last output: done only once the output has ended too.
        elif (channel.eof_received and channel.status_event.is_set()) or channel.closed:
            break
        else:
            if timezone.now() > deadline:
                raise TurnTimeout
            select.select([channel], [], [], FLUSH_SECONDS)
            answer.tick()
    return channel.recv_exit_status(), errors.decode(errors="replace")


def _usage(ssh: paramiko.SSHClient, reply_id: str) -> dict:
    """What the runtime reported the turn cost (`usage.json` in its run directory), if it did."""
    _, out, _ = ssh.exec_command(f"cat {RUNS_DIR}/{shlex.quote(reply_id)}/usage.json 2>/dev/null")
    try:
        usage = json.loads(out.read() or b"{}")
    except ValueError:
        return {}
    return usage if isinstance(usage, dict) else {}


class _Answer:
    """The answer as it streams in: decoded, saved with its byte offset, published in pieces."""

    def __init__(self, reply: ChatMessage):
        self.reply = reply
        self.text = chat_content(reply)
        self.offset = reply.output_offset
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._undecoded = 0
        self._pending = ""
        # The page counts in UTF-16 units; kept as the text grows rather than re-measured at each save.
        self._published_utf16 = _utf16_len(self.text)
        # Never saved yet: the first piece goes out at once (it is the one the operator waits for).
        self._saved_at, self._beat_at = 0.0, time.monotonic()

    def add(self, data: bytes) -> None:
        piece = self._decoder.decode(data)
        self.text += piece
        self._pending += piece
        # Only whole characters count: a resumed follower starts on a character boundary.
        self.offset += len(data)
        self._undecoded = len(self._decoder.getstate()[0])
        self.tick()

    def tick(self) -> None:
        now = time.monotonic()
        due = self._pending and now - self._saved_at >= FLUSH_SECONDS
        if due or now - self._beat_at >= heartbeat_seconds():
            self.save()

    def save(self) -> None:
        offset = self.offset - self._undecoded
        # The new piece is appended, never the whole answer rewritten; in one transaction with the
        # follower's claim, so a follower that was replaced meanwhile writes nothing.
        with transaction.atomic():
            if not _mine(self.reply).update(output_offset=offset, heartbeat_at=timezone.now()):
                raise Superseded
            if self._pending:
                ChatChunk.objects.create(message_id=self.reply.id, text=self._pending)
        if self._pending:
            _publish(self.reply, at=self._published_utf16, text=self._pending)
            self._published_utf16 += _utf16_len(self._pending)
            self._pending = ""
        self._saved_at = self._beat_at = time.monotonic()


def _finish(
    reply: ChatMessage,
    content: str,
    *,
    failed: bool,
    answer: _Answer | None = None,
    usage: dict | None = None,
) -> None:
    usage = usage or {}
    reply.status = Status.ERROR if failed else Status.DONE
    if failed and answer is not None and answer.text.strip():
        content = f"{answer.text.strip()}\n\n{content}"  # what the agent said before failing is kept
    with transaction.atomic():
        updated = _mine(reply).update(
            content=content,
            status=reply.status,
            completed_at=timezone.now(),
            input_tokens=_count(usage, "inputTokens"),
            output_tokens=_count(usage, "outputTokens"),
            model_requests=_count(usage, "requests"),
        )
        if not updated:
            raise Superseded
        ChatChunk.objects.filter(message_id=reply.id).delete()  # the whole answer is in `content` now
    _publish(reply, at=0, text=content)


def _mine(reply: ChatMessage):
    """The reply, as long as this follower still holds it."""
    return ChatMessage.objects.filter(id=reply.id, follower=reply.follower)


def _utf16_len(text: str) -> int:
    """Length as the page's JavaScript counts it, so its pieces line up."""
    return len(text.encode("utf-16-le")) // 2


def _count(usage: dict, name: str) -> int:
    value = usage.get(name, 0)
    return value if isinstance(value, int) and value >= 0 else 0


def _publish(reply: ChatMessage, *, at: int, text: str) -> None:
    publish_chat_update(
        ChatUpdated(
            message_id=reply.id,
            desktop_id=reply.desktop_id,
            workspace_id=reply.desktop.workspace_id,
            status=reply.status,
            at=at,
            text=text,
        )
    )
