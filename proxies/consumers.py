"""Browser <-> desktop relays. No desktop port is ever exposed: the control plane dials it.

Each relay claims its single-use ticket (sent as a WebSocket subprotocol, never in the URL) before
touching the desktop, joins the groups through which it can be told to close (the desktop's, its
user's, its API key's), reports itself alive, and closes with a clear code when the desktop stops
running or its user loses access. The screen relay speaks RFB to both sides itself (``proxies.rfb``);
the terminal relay reads its shell in a thread of its own, so no relay can hold up another.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import parse_qs

import paramiko
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.db import close_old_connections
from django.utils.translation import gettext as _

from desktops.events import api_key_group, desktop_group, user_group
from desktops.guest import desktop_ssh_connect, terminal_command
from desktops.relays import (
    HEARTBEAT_SECONDS,
    Kind,
    Mode,
    RelayDenied,
    relay_closed,
    relay_grant_recheck,
    relay_seen,
    relay_ticket_claim,
)
from desktops.rfb import RfbReader, ScreenUnreachable, ServerRefused, screen_link_open, server_handshake
from proxies.rfb import BrowserHandshake, ClientMessages, RfbViolation

logger = logging.getLogger(__name__)
# The ticket rides in Sec-WebSocket-Protocol (never in a URL that proxies log): "lebureau.ticket.<ticket>".
TICKET_PROTOCOL = "lebureau.ticket."
# The subprotocol the relay answers with: noVNC's own, or ours.
ANSWERED_PROTOCOLS = ("binary", "lebureau.relay")


def stop(pump: asyncio.Task | None) -> None:
    """Stop a relay's pump, unless it is the pump itself that is closing the relay."""
    if pump is not None and pump is not asyncio.current_task():
        pump.cancel()


class RelayConsumer(AsyncWebsocketConsumer):
    """Ticket checks, forced disconnects, heartbeats and teardown shared by both relays."""

    kind = ""
    grant = None
    backend_open = False
    denied = False
    groups_joined: tuple[str, ...] = ()
    heartbeat = None

    async def connect(self):
        desktop_id = self.scope["url_route"]["kwargs"]["desktop_id"]
        self.query = {k: v[0] for k, v in parse_qs(self.scope["query_string"].decode()).items()}
        offered = self.scope.get("subprotocols", [])
        ticket = next((p.removeprefix(TICKET_PROTOCOL) for p in offered if p.startswith(TICKET_PROTOCOL)), "")
        # Accept first so the refusal can carry a close code and a reason the page can show.
        await self.accept(subprotocol=next((p for p in ANSWERED_PROTOCOLS if p in offered), None))
        session_key = self.scope.get("cookies", {}).get(settings.SESSION_COOKIE_NAME, "")
        try:
            self.grant, host = await database_sync_to_async(relay_ticket_claim)(
                ticket=ticket, desktop_id=desktop_id, kind=self.kind, session_key=session_key
            )
            await self.open_backend(host)
        except RelayDenied as denied:
            await self.deny(denied)
            return
        self.backend_open = True
        groups = [desktop_group(desktop_id), user_group(self.grant.user_id)]
        if self.grant.api_key_id:
            groups.append(api_key_group(self.grant.api_key_id))
        self.groups_joined = tuple(groups)
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)
        self.heartbeat = asyncio.create_task(self._beat())

    async def disconnect(self, code):
        if self.heartbeat is not None:
            self.heartbeat.cancel()
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)
        if self.grant is not None:
            await database_sync_to_async(relay_closed)(self.grant)
        if self.backend_open:  # a relay refused before its backend opened has nothing to close
            await self.close_backend()

    async def deny(self, denied: RelayDenied):
        # The desktop side goes first: a client that ignores the close must not be heard any more.
        self.denied = True
        if self.backend_open:
            self.backend_open = False
            await self.close_backend()
        await self.close(code=denied.code, reason=denied.reason)

    async def _beat(self):
        # Each beat checks access again too: what no access change announced (a queryset update) ends here.
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            await database_sync_to_async(relay_seen)(self.grant)
            await self.access_changed({})

    @property
    def may_control(self) -> bool:
        return self.grant is not None and self.grant.mode == Mode.CONTROL

    # Group messages (see desktops.events)

    async def desktop_state(self, event):
        if event["state"] != "running":
            await self.deny(RelayDenied(4409, _("The desktop is %(state)s.") % {"state": event["state"]}))

    async def access_changed(self, event):
        try:
            await database_sync_to_async(relay_grant_recheck)(self.grant)
        except RelayDenied as denied:
            await self.deny(denied)

    async def open_backend(self, host: str) -> None:
        raise NotImplementedError

    async def close_backend(self) -> None:
        raise NotImplementedError


class VncRelayConsumer(RelayConsumer):
    """noVNC's RFB over a WebSocket <-> the desktop's VNC server over TCP, or, when that does not
    answer, the VM's console through its engine (``desktops.rfb``)."""

    kind = Kind.VNC

    async def open_backend(self, host):
        desktop_id = self.grant.desktop_id
        try:
            link = await screen_link_open(desktop_id=desktop_id, host=host, mode=self.grant.mode)
        except ServerRefused as exc:
            logger.warning("the console of %s refused the relay: %s", desktop_id, exc)
            raise RelayDenied(4503, _("The desktop's console refused the relay.")) from exc
        except ScreenUnreachable as exc:
            raise RelayDenied(4502, _("The desktop's screen is not answering.")) from exc
        self.screen = link.stream
        reader = RfbReader(self.screen.next_chunk)
        try:
            server_init = await asyncio.wait_for(
                server_handshake(reader, self.screen.write, link.password), 10
            )
        except (ServerRefused, TimeoutError) as exc:
            await self.screen.close()
            logger.warning("the screen of %s refused the relay: %s", desktop_id, exc)
            if link.console:
                raise RelayDenied(4503, _("The desktop's console refused the relay.")) from exc
            raise RelayDenied(4503, _("The desktop's screen refused the relay.")) from exc
        self.pending = reader.rest()
        self.pump = None
        self.browser = BrowserHandshake(lambda data: self.send(bytes_data=data), server_init)
        self.messages = ClientMessages(allow_input=self.may_control)
        await self.browser.start()

    async def _desktop_to_browser(self):
        if self.pending:
            await self.send(bytes_data=self.pending)
        while data := await self.screen.next_chunk():
            await self.send(bytes_data=data)
        await self.deny(RelayDenied(4502, _("The desktop closed its screen.")))

    async def receive(self, text_data=None, bytes_data=None):
        if bytes_data is None or self.denied:
            return
        try:
            if not self.browser.done:
                bytes_data = await self.browser.feed(bytes_data)
                if not self.browser.done:
                    return
                if self.pump is None:
                    # The screen's updates flow once the browser has its ServerInit.
                    self.pump = asyncio.create_task(self._desktop_to_browser())
            data = self.messages.feed(bytes_data)
            if data:
                await self.screen.write(data)
        except RfbViolation as exc:
            await self.deny(
                RelayDenied(4400, _("Not a VNC message the relay accepts: %(why)s.") % {"why": exc})
            )

    async def close_backend(self):
        stop(self.pump)
        await self.screen.close()


class _Shell:
    """One terminal's SSH shell, read by a thread of its own: a stalled desktop holds only its relay.

    The thread hands output to the event loop and counts what the page has not acknowledged yet:
    past ``high`` bytes it stops reading until acknowledgements bring that under ``low``. Everything
    else (opening, typing, resizing, closing) runs on the relay's own single worker thread.
    """

    # SSH packets carry at most 32 KiB: reading more at once only lets the count overshoot.
    READ = 32 * 1024

    def __init__(self, loop: asyncio.AbstractEventLoop, output: asyncio.Queue[bytes], high: int, low: int):
        self.loop, self.output, self.high, self.low = loop, output, high, low
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="terminal")
        self.unacked = 0
        self.lock = threading.Lock()
        self.flowing = threading.Event()
        self.flowing.set()
        self.stopped = threading.Event()
        self.ssh = self.channel = None

    async def run(self, function, *args):
        return await self.loop.run_in_executor(self.worker, function, *args)

    def open(self, desktop_id: str, host: str, cols: int, rows: int, command: str) -> None:
        try:
            self.ssh = desktop_ssh_connect(desktop_id=desktop_id, host=host, timeout=10)
            self.channel = self.ssh.get_transport().open_session()
            self.channel.get_pty(term="xterm-256color", width=cols, height=rows)
            self.channel.exec_command(command)
        finally:
            close_old_connections()  # this thread's database connection is not needed again
        # Wakes the reader regularly, so it notices a close even when the shell says nothing.
        self.channel.settimeout(1.0)
        threading.Thread(target=self._read, name="terminal-reader", daemon=True).start()

    def acknowledged(self, count: int) -> None:
        with self.lock:
            self.unacked = max(0, self.unacked - count)
            if self.unacked < self.low:
                self.flowing.set()

    def _read(self) -> None:
        while not self.stopped.is_set():
            if not self.flowing.wait(timeout=1.0):
                continue
            try:
                data = self.channel.recv(self.READ)
            except TimeoutError:
                continue
            except (OSError, paramiko.SSHException):
                data = b""
            with self.lock:
                self.unacked += len(data)
                if self.unacked > self.high:
                    self.flowing.clear()
            self.loop.call_soon_threadsafe(self.output.put_nowait, data)
            if not data:
                return

    def close(self) -> None:
        self.stopped.set()
        if self.ssh is not None:
            self.ssh.close()


class TerminalRelayConsumer(RelayConsumer):
    """xterm.js <-> the desktop's shared terminal session (``terminal_command``), in a PTY over SSH.

    Browser -> relay: JSON text frames {"type": "input"|"resize"|"ack", …}.
    Relay -> browser: the shell's raw output as binary frames. The page acknowledges
    what it has drawn; past HIGH_WATER unacknowledged bytes the relay stops reading,
    SSH's window fills and the shell itself waits: nothing piles up in between.
    """

    kind = Kind.TERMINAL
    HIGH_WATER = 512 * 1024
    LOW_WATER = 128 * 1024
    # A large paste fits; a bigger frame is an attempt to make the relay hold or parse a flood.
    MAX_MESSAGE = 64 * 1024
    MAX_SIDE = 1000

    @classmethod
    def pty_size(cls, cols, rows) -> tuple[int, int]:
        cols, rows = int(cols), int(rows)
        if not (0 < cols <= cls.MAX_SIDE and 0 < rows <= cls.MAX_SIDE):
            raise ValueError(f"a terminal of {cols}x{rows}")
        return cols, rows

    async def open_backend(self, host):
        try:
            cols, rows = self.pty_size(self.query.get("cols", 80), self.query.get("rows", 24))
        except ValueError as exc:
            raise RelayDenied(4400, _("A terminal's size is 1 to 1000 columns and rows.")) from exc
        self.output: asyncio.Queue[bytes] = asyncio.Queue()
        self.shell = _Shell(asyncio.get_running_loop(), self.output, self.HIGH_WATER, self.LOW_WATER)
        try:
            command = terminal_command(control=self.may_control)
            await self.shell.run(self.shell.open, self.grant.desktop_id, host, cols, rows, command)
        except (paramiko.SSHException, OSError) as exc:
            await self.shell.run(self.shell.close)
            raise RelayDenied(4502, _("The desktop's terminal is not answering.")) from exc
        self.pump = asyncio.create_task(self._desktop_to_browser())

    async def _desktop_to_browser(self):
        while data := await self.output.get():
            await self.send(bytes_data=data)
        await self.deny(RelayDenied(4502, _("The terminal session ended.")))

    async def receive(self, text_data=None, bytes_data=None):
        if self.denied:
            return
        if len(text_data or bytes_data or "") > self.MAX_MESSAGE:
            too_big = _("A terminal message has at most %(max)d bytes.") % {"max": self.MAX_MESSAGE}
            await self.deny(RelayDenied(4413, too_big))
            return
        try:
            message = json.loads(text_data or "")
            kind = message["type"]
            if kind == "input" and self.may_control:
                await self.shell.run(self.shell.channel.sendall, str(message["data"]).encode())
            elif kind == "resize":
                cols, rows = self.pty_size(message["cols"], message["rows"])
                await self.shell.run(lambda: self.shell.channel.resize_pty(width=cols, height=rows))
            elif kind == "ack":
                self.shell.acknowledged(int(message["bytes"]))
        except (ValueError, KeyError, TypeError, RecursionError):
            await self.deny(
                RelayDenied(4400, _("Terminal messages are JSON objects with a type and its fields."))
            )

    async def close_backend(self):
        stop(self.pump)
        await self.shell.run(self.shell.close)
        self.shell.worker.shutdown(wait=False)
