"""The bridge's bookkeeping in PostgreSQL: one turn per desktop, in order, and orphans handed on."""

from datetime import timedelta

import pytest
from django.utils import timezone

from desktops import chat, services
from desktops.audit import Actor
from desktops.errors import Forbidden
from desktops.models import AuditEvent, ChatChunk, ChatMessage, Role
from tests.conftest import client_for
from tests.factories import DesktopFactory


def send(members, desktop, text: str) -> ChatMessage:
    return services.chat_send(actor=Actor(user=members[Role.MEMBER].user), desktop=desktop, message=text)


def test_a_desktop_runs_one_turn_at_a_time_oldest_first(members, workspace):
    desktop = DesktopFactory(workspace=workspace, state="running")
    other = DesktopFactory(workspace=workspace, state="running")
    first, second = send(members, desktop, "un"), send(members, desktop, "deux")
    elsewhere = send(members, other, "ailleurs")

    assert chat.chat_claim_next(desktop_id=desktop.id) == first
    assert chat.chat_claim_next(desktop_id=desktop.id) is None  # `first` is running
    assert chat.chat_claim_next(desktop_id=other.id) == elsewhere  # desktops do not wait for each other
    assert ChatMessage.objects.get(id=second.id).status == "queued"

    ChatMessage.objects.filter(id=first.id).update(status="done")
    assert chat.chat_claim_next(desktop_id=desktop.id) == second


def test_orphaned_turns_and_stalled_queues_are_handed_on_once(members, workspace, settings):
    settings.CHAT_STALE_AFTER = 60
    desktop = DesktopFactory(workspace=workspace, state="running")
    stalled = DesktopFactory(workspace=workspace, state="running")
    orphan = send(members, desktop, "longue tâche")
    chat.chat_claim_next(desktop_id=desktop.id)
    waiting = send(members, stalled, "oubliée")
    long_ago = timezone.now() - timedelta(minutes=5)
    ChatMessage.objects.filter(id=orphan.id).update(heartbeat_at=long_ago)
    ChatMessage.objects.filter(id=waiting.id).update(created_at=long_ago)

    old_follower = ChatMessage.objects.get(id=orphan.id).follower
    orphans, stalled_desktops = chat.chat_resume()
    assert [reply_id for reply_id, _ in orphans] == [orphan.id] and stalled_desktops == [stalled.id]
    # The turn has a new follower: the old one's token no longer lets it write or finish.
    new_follower = orphans[0][1]
    assert str(ChatMessage.objects.get(id=orphan.id).follower) == new_follower != str(old_follower)
    assert chat.chat_follow(message_id=orphan.id, follower=str(old_follower)) is None
    # Its heartbeat now belongs to the new follower: a second sweep leaves it alone.
    assert chat.chat_resume() == ([], [stalled.id])


def test_one_workspace_never_runs_more_turns_than_its_share(members, workspace, settings):
    """Turns are followed by a shared pool of workers: one workspace keeps at most its share of it."""
    settings.CHAT_TURNS_PER_WORKSPACE = 2
    desktops = [DesktopFactory(workspace=workspace, state="running") for _ in range(3)]
    replies = [send(members, desktop, "travaille") for desktop in desktops]
    claimed = [chat.chat_claim_next(desktop_id=desktop.id) for desktop in desktops]
    assert claimed == [replies[0], replies[1], None]
    assert chat.chat_waiting(workspace_id=workspace.id) == [desktops[2].id]
    # Another workspace's turn is not held back by this one.
    elsewhere = DesktopFactory(state="running")
    owner = elsewhere.workspace.memberships.create(user=members[Role.MEMBER].user, role=Role.OWNER)
    other_reply = services.chat_send(actor=Actor(user=owner.user), desktop=elsewhere, message="ailleurs")
    assert chat.chat_claim_next(desktop_id=elsewhere.id) == other_reply
    # A finished turn frees its slot for the turn that waited.
    ChatMessage.objects.filter(id=replies[0].id).update(status="done")
    assert chat.chat_claim_next(desktop_id=desktops[2].id) == replies[2]


def test_instructing_the_agent_takes_the_workspaces_control_role(members, workspace):
    """The agent reads what its desktop holds, keys included: asking it is controlling the desktop."""
    desktop = DesktopFactory(workspace=workspace, state="running")
    workspace.control_role = Role.ADMIN
    workspace.save()
    with pytest.raises(Forbidden, match="needs the Admin role"):
        send(members, desktop, "lis-moi la clé")
    assert not ChatMessage.objects.filter(desktop=desktop).exists()


def cancel_url(desktop, message) -> str:
    return f"/api/desktops/{desktop.id}/chat/{message.id}/cancel"


def test_a_queued_turn_cancelled_never_starts_and_the_next_one_does(members, workspace):
    desktop = DesktopFactory(workspace=workspace, state="running")
    first, second = send(members, desktop, "un"), send(members, desktop, "deux")
    # By the operator's own message, as the conversation shows it.
    response = client_for(members[Role.MEMBER]).post(cancel_url(desktop, first.reply_to))
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "cancelled"
    assert chat.chat_claim_next(desktop_id=desktop.id) == second
    assert AuditEvent.objects.filter(action="chat.cancel", detail__message=first.id).exists()
    again = client_for(members[Role.MEMBER]).post(cancel_url(desktop, first))
    assert again.status_code == 409, again.content


def test_cancelling_a_running_turn_takes_it_from_its_follower(members, workspace):
    desktop = DesktopFactory(workspace=workspace, state="running")
    reply = send(members, desktop, "longue tâche")
    claimed = chat.chat_claim_next(desktop_id=desktop.id)
    ChatChunk.objects.create(message_id=reply.id, text="déjà dit")
    stopped = chat.chat_cancel(
        actor=Actor(user=members[Role.MEMBER].user), desktop=desktop, message_id=reply.id
    )
    assert (stopped.status, stopped.content) == ("cancelled", "déjà dit")
    # The follower no longer holds the turn: whatever it would write next is refused.
    with pytest.raises(chat.Superseded):
        chat._Answer(claimed).save()


def test_a_cancel_takes_the_control_role_and_an_outsider_sees_nothing(members, workspace):
    desktop = DesktopFactory(workspace=workspace, state="running")
    reply = send(members, desktop, "travaille")
    viewer = client_for(members[Role.VIEWER]).post(cancel_url(desktop, reply))
    assert viewer.status_code == 403, viewer.content
    outsider = client_for(members["outsider"]).post(cancel_url(desktop, reply))
    assert outsider.status_code == 404, outsider.content
    # Another desktop's message is not found through this one.
    mine = DesktopFactory(workspace=members["outsider"].workspace, state="running")
    crossed = client_for(members["outsider"]).post(cancel_url(mine, reply))
    assert crossed.status_code == 404, crossed.content
    assert ChatMessage.objects.get(id=reply.id).status == "queued"
