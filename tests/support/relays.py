"""Opening relays in tests the way a browser does: a ticket in the subprotocol, the session's cookie."""

from channels.testing import WebsocketCommunicator

from desktops.audit import Actor
from desktops.relays import relay_tickets_mint
from lebureau.asgi import application

SESSION = "relay-test-session-key"


def mint(member, desktop, mode="control", *, api_key=None, session=SESSION):
    actor = Actor(user=member.user, api_key=api_key)
    return relay_tickets_mint(actor=actor, desktop_id=desktop.id, mode=mode, session_key=session)


async def open_relay(desktop_id: str, kind: str, ticket: str | None, *, session=SESSION, query=""):
    protocols = ["binary"] + ([f"lebureau.ticket.{ticket}"] if ticket else [])
    headers = [(b"origin", b"http://127.0.0.1"), (b"cookie", f"sessionid={session}".encode())]
    communicator = WebsocketCommunicator(
        application, f"/ws/desktops/{desktop_id}/{kind}{query}", headers=headers, subprotocols=protocols
    )
    connected, subprotocol = await communicator.connect(timeout=10)
    assert connected and subprotocol == "binary"  # the ticket itself is never echoed back
    return communicator


async def closed_with(communicator, timeout=5):
    while True:
        message = await communicator.receive_output(timeout=timeout)
        if message["type"] == "websocket.close":
            return message["code"], message.get("reason", "")
