"""The floor of any relay served by daphne: a bare ASGI app (no Django, no Channels) that pipes one
WebSocket to the TCP port in BARE_RELAY_TARGET, byte for byte. bench/relay.py reads the project's relay
against it; it is never served to anyone.

    daphne bench.bare_relay:application
"""

import asyncio
import os


async def application(scope, receive, send):
    if scope["type"] != "websocket":
        return
    await receive()  # websocket.connect
    host, port = os.environ["BARE_RELAY_TARGET"].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    await send({"type": "websocket.accept", "subprotocol": "binary"})

    async def upstream():
        while data := await reader.read(262144):
            await send({"type": "websocket.send", "bytes": data})

    pump = asyncio.create_task(upstream())
    try:
        while (message := await receive())["type"] == "websocket.receive":
            writer.write(message.get("bytes") or b"")
            await writer.drain()
    finally:
        pump.cancel()
        writer.close()
