"""The viewer's page: who watches a desktop and who has control, for the workspace's members only."""

import pytest

from desktops.audit import Actor
from desktops.models import DesktopState, Role
from desktops.relays import Kind, desktop_watchers, relay_closed, relay_ticket_claim, relay_tickets_mint
from tests.factories import DesktopFactory


def open_relay(membership, desktop, mode: str, session_key: str = "s"):
    tickets = relay_tickets_mint(
        actor=Actor(user=membership.user), desktop_id=desktop.id, mode=mode, session_key=session_key
    )
    grant, _host = relay_ticket_claim(
        ticket=tickets.vnc, desktop_id=desktop.id, kind=Kind.VNC, session_key=session_key
    )
    return grant


@pytest.fixture
def running(workspace, plan):
    return DesktopFactory(workspace=workspace, state=DesktopState.RUNNING, private_ip="10.213.0.9")


def test_the_viewer_says_who_watches_and_who_has_control(client, members, running):
    viewer, member = members[Role.VIEWER], members[Role.MEMBER]
    open_relay(viewer, running, "view")
    control = open_relay(member, running, "control")
    assert [(w.email, w.controls) for w in desktop_watchers(desktop=running)] == sorted(
        [(viewer.user.email, False), (member.user.email, True)]
    )

    client.force_login(viewer.user)
    presence = client.get(f"/desktops/{running.id}/watchers/").content.decode()
    assert f"{member.user.email} has control" in presence and "2 people watching" in presence
    assert "you" in presence
    # The viewer page itself opens with the same line, and in View mode.
    page = client.get(f"/desktops/{running.id}/").content.decode()
    assert f"{member.user.email} has control" in page
    assert 'id="mode-view" aria-pressed="true"' in page

    relay_closed(control)
    presence = client.get(f"/desktops/{running.id}/watchers/").content.decode()
    assert "has control" not in presence and "1 person watching" in presence


def test_an_outsider_cannot_see_who_watches(client, members, running):
    open_relay(members[Role.MEMBER], running, "control")
    client.force_login(members["outsider"].user)
    response = client.get(f"/desktops/{running.id}/watchers/")
    assert response.status_code == 404
    assert members[Role.MEMBER].user.email not in response.content.decode()
    client.logout()
    assert client.get(f"/desktops/{running.id}/watchers/").status_code == 302


def test_the_viewer_speaks_the_browsers_language(client, members, running):
    client.force_login(members[Role.MEMBER].user)
    french = client.get(f"/desktops/{running.id}/", HTTP_ACCEPT_LANGUAGE="fr-FR,fr;q=0.9").content.decode()
    assert '<html lang="fr">' in french
    assert "Prendre le contrôle" in french and "Regarder" in french and "Coller" in french
    english = client.get(f"/desktops/{running.id}/", HTTP_ACCEPT_LANGUAGE="en-US").content.decode()
    assert "Take control" in english


def test_the_lifecycle_in_the_viewer_is_for_members_and_follows_the_state(client, members, workspace, plan):
    stopped = DesktopFactory(workspace=workspace, state=DesktopState.STOPPED)
    client.force_login(members[Role.MEMBER].user)
    page = client.get(f"/desktops/{stopped.id}/").content.decode()
    assert 'data-action="start" data-when="error stopped">' in page
    assert 'data-action="stop" data-when="running" hidden>' in page
    assert 'id="not-running" role="status">' in page  # shown: sending, control and paste wait
    client.force_login(members[Role.VIEWER].user)
    page = client.get(f"/desktops/{stopped.id}/").content.decode()
    assert 'id="lifecycle"' not in page and "data-action=" not in page
    # And the API the buttons call refuses a viewer anyway.
    client.force_login(members[Role.VIEWER].user)
    assert client.post(f"/api/desktops/{stopped.id}/start").status_code == 403
