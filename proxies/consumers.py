"""Browser <-> desktop relays. No desktop port is ever exposed: the control plane dials it.

Each relay checks its token before touching the desktop, joins the desktop's and
the user's groups, and closes with a clear code when the desktop stops running or
the user loses access.
"""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import parse_qs

import paramiko
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from websockets.exceptions import InvalidHandshake

from desktops.engines import desktop_console
from desktops.errors import Unavailable
from desktops.events import desktop_group, user_group
from desktops.guest import desktop_ssh_connect
from proxies.console import ConsoleRefused, ConsoleScreen
from proxies.rfb import ClientStreamFilter, RfbViolation
from proxies.sessions import Mode, RelayDenied, relay_grant_check, relay_grant_recheck

logger = logging.getLogger(__name__)
CHUNK = 256 * 1024


class RelayConsumer(AsyncWebsocketConsumer):
    """Token checks, forced disconnects and teardown shared by both relays."""

    grant = None
    backend_open = False
    groups_joined: tuple[str, ...] = ()

    async def connect(self):
        desktop_id = self.scope["url_route"]["kwargs"]["desktop_id"]
        self.query = {k: v[0] for k, v in parse_qs(self.scope["query_string"].decode()).items()}
        # Accept first so the refusal can carry a close code and a reason the page can show.
        await self.accept()
        try:
            self.grant, host = await database_sync_to_async(relay_grant_check)(
                token=self.query.get("token", ""), desktop_id=desktop_id
            )
            await self.open_backend(host)
        except RelayDenied as denied:
            await self.deny(denied)
            return
        self.backend_open = True
        self.groups_joined = (desktop_group(desktop_id), user_group(self.grant.user_id))
        for group in self.groups_joined:
            await self.channel_layer.group_add(group, self.channel_name)

    async def disconnect(self, code):
        for group in self.groups_joined:
            await self.channel_layer.group_discard(group, self.channel_name)
        if self.backend_open:  # a relay refused before its backend opened has nothing to close
            await self.close_backend()

    async def deny(self, denied: RelayDenied):
        await self.close(code=denied.code, reason=denied.reason)

    @property
    def may_control(self) -> bool:
        return self.grant is not None and self.grant.mode == Mode.CONTROL

    # Group messages (see desktops.events)

    async def desktop_state(self, event):
        if event["state"] != "running":
            await self.deny(RelayDenied(4409, f"The desktop is {event['state']}."))

    async def access_changed(self, event):
        try:
            await database_sync_to_async(relay_grant_recheck)(self.grant)
        except RelayDenied as denied:
            await self.deny(denied)

    async def open_backend(self, host: str) -> None:
        raise NotImplementedError

    async def close_backend(self) -> None:
        raise NotImplementedError


class _DesktopScreen(asyncio.Protocol):
    """The TCP side of a VNC relay: hands each chunk the kernel gives over as it is, without
    the copies of a stream reader, and stops reading while the browser side is behind."""

    MAX_QUEUED = 4

    def __init__(self):
        self.chunks: asyncio.Queue[bytes] = asyncio.Queue()
        self.transport = None

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.chunks.put_nowait(data)
        if self.chunks.qsize() >= self.MAX_QUEUED:
            self.transport.pause_reading()

    def connection_lost(self, exc):
        self.chunks.put_nowait(b"")

    async def next_chunk(self) -> bytes:
        data = await self.chunks.get()
        if self.chunks.qsize() < self.MAX_QUEUED and not self.transport.is_closing():
            self.transport.resume_reading()
        return data

    async def write(self, data: bytes) -> None:
        self.transport.write(data)

    async def close(self) -> None:
        self.transport.close()


class VncRelayConsumer(RelayConsumer):
    """noVNC's RFB over a WebSocket <-> the desktop's VNC server over TCP, or, when that does not
    answer, the VM's console through its engine (``proxies.console``)."""

    async def open_backend(self, host):
        loop = asyncio.get_running_loop()
        try:
            _, self.screen = await asyncio.wait_for(
                loop.create_connection(_DesktopScreen, host, settings.DESKTOP_VNC_PORT), timeout=5
            )
        except (OSError, TimeoutError):
            self.screen = await self._engine_console()
        self.rfb = ClientStreamFilter(allow_input=self.may_control)
        self.pump = asyncio.create_task(self._desktop_to_browser())

    async def _engine_console(self) -> ConsoleScreen:
        desktop_id = self.grant.desktop_id
        try:
            # Not the shared sync thread: the engine may take a while to answer.
            ticket = await database_sync_to_async(desktop_console, thread_sensitive=False)(
                desktop_id=desktop_id
            )
            return await ConsoleScreen.open(ticket, lambda data: self.send(bytes_data=data))
        except ConsoleRefused as exc:
            logger.warning("the console of %s refused the relay: %s", desktop_id, exc)
            raise RelayDenied(4503, "The desktop's console refused the relay.") from exc
        except (Unavailable, OSError, TimeoutError, InvalidHandshake) as exc:
            # Engines without a console of their own (LXC) end here too.
            raise RelayDenied(4502, "The desktop's screen is not answering.") from exc

    async def _desktop_to_browser(self):
        while data := await self.screen.next_chunk():
            await self.send(bytes_data=data)
        await self.deny(RelayDenied(4502, "The desktop closed its screen."))

    async def receive(self, text_data=None, bytes_data=None):
        if bytes_data is None:
            return
        try:
            data = self.rfb.feed(bytes_data)
            if data:
                await self.screen.write(data)
        except RfbViolation as exc:
            await self.deny(RelayDenied(4400, f"Not a VNC message the relay accepts: {exc}."))

    async def close_backend(self):
        self.pump.cancel()
        await self.screen.close()


class TerminalRelayConsumer(RelayConsumer):
    """xterm.js <-> a PTY shell in the desktop over SSH.

    Browser -> relay: JSON text frames {"type": "input"|"resize"|"ack", …}.
    Relay -> browser: the shell's raw output as binary frames. The page acknowledges
    what it has drawn; past HIGH_WATER unacknowledged bytes the relay stops reading,
    SSH's window fills and the shell itself waits: nothing piles up in between.
    """

    HIGH_WATER = 512 * 1024
    LOW_WATER = 128 * 1024

    async def open_backend(self, host):
        cols, rows = int(self.query.get("cols", 80)), int(self.query.get("rows", 24))
        try:
            self.ssh, self.channel = await database_sync_to_async(self._open_shell)(host, cols, rows)
        except (paramiko.SSHException, OSError) as exc:
            raise RelayDenied(4502, "The desktop's terminal is not answering.") from exc
        self.unacked = 0
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.pump = asyncio.create_task(self._desktop_to_browser())

    def _open_shell(self, host, cols, rows):
        ssh = desktop_ssh_connect(desktop_id=self.grant.desktop_id, host=host)
        channel = ssh.invoke_shell(term="xterm-256color", width=cols, height=rows)
        return ssh, channel

    async def _desktop_to_browser(self):
        while True:
            await self.flowing.wait()
            data = await asyncio.to_thread(self.channel.recv, CHUNK)
            if not data:
                break
            self.unacked += len(data)
            if self.unacked > self.HIGH_WATER:
                self.flowing.clear()
            await self.send(bytes_data=data)
        await self.deny(RelayDenied(4502, "The terminal session ended."))

    async def receive(self, text_data=None, bytes_data=None):
        try:
            message = json.loads(text_data or "")
            kind = message["type"]
            if kind == "input" and self.may_control:
                await asyncio.to_thread(self.channel.sendall, str(message["data"]).encode())
            elif kind == "resize":
                cols, rows = int(message["cols"]), int(message["rows"])
                await asyncio.to_thread(self.channel.resize_pty, width=cols, height=rows)
            elif kind == "ack":
                self.unacked = max(0, self.unacked - int(message["bytes"]))
                if self.unacked < self.LOW_WATER:
                    self.flowing.set()
        except (ValueError, KeyError, TypeError):
            await self.deny(
                RelayDenied(4400, "Terminal messages are JSON objects with a type and its fields.")
            )

    async def close_backend(self):
        self.pump.cancel()
        await asyncio.to_thread(self.ssh.close)
