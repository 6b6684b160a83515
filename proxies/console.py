"""The VNC relay's fallback: the VM's emulated display through its engine, when the guest's VNC is down.

With Proxmox that is ``vncwebsocket``: a WebSocket (subprotocol ``binary``) carrying the RFB stream
of QEMU's own VNC server, which ``vncproxy`` put behind VNC authentication with a one-time password.
The relay authenticates with it like with a guest's server (``proxies.rfb``): the password, good for
anyone who reaches the socket in the next seconds, never leaves the control plane.
"""

from __future__ import annotations

import ssl

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from desktops.engines import ConsoleTicket
from proxies.rfb import ServerRefused


class ConsoleStream:
    """The console's RFB bytes, as the relay reads and writes a guest's VNC server."""

    def __init__(self, websocket: ClientConnection):
        self.websocket = websocket

    @classmethod
    async def open(cls, ticket: ConsoleTicket) -> ConsoleStream:
        """Raises ServerRefused when turned away, OSError, TimeoutError or InvalidHandshake otherwise."""
        try:
            websocket = await connect(
                ticket.url,
                additional_headers=ticket.headers,
                subprotocols=["binary"],
                ssl=_tls(ticket.verify),
                compression=None,
                open_timeout=10,
            )
        except InvalidStatus as exc:
            response = exc.response
            raise ServerRefused(f"HTTP {response.status_code} {response.reason_phrase}") from exc
        return cls(websocket)

    async def next_chunk(self) -> bytes:
        """What the console sent next; empty once it is closed."""
        while True:
            try:
                data = await self.websocket.recv(decode=False)
            except ConnectionClosed:
                return b""
            if data:  # an empty message is not the end of the stream
                return data

    async def write(self, data: bytes) -> None:
        await self.websocket.send(data)

    async def close(self) -> None:
        await self.websocket.close()


def _tls(verify: bool | str) -> ssl.SSLContext:
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    return ssl.create_default_context(cafile=verify if isinstance(verify, str) else None)
