"""The viewer's page: who watches a desktop and who has control, for the workspace's members only."""

import pytest
from django.test import Client

from desktops.audit import Actor
from desktops.models import AuditEvent, DesktopState, Role
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


def test_files_in_the_viewer_are_for_those_who_may_take_control(members, running, plan):
    """The viewer's upload goes to the files API as the page sends it (session, CSRF token): a viewer who
    forges it is refused before a byte lands, and only roles that may take control see the controls."""
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(members[Role.VIEWER].user)
    page = browser.get(f"/desktops/{running.id}/").content.decode()
    assert 'id="upload-form"' not in page and 'id="download-form"' not in page
    assert "need the Member role" in page
    token = browser.cookies["csrftoken"].value
    upload = browser.put(
        f"/api/desktops/{running.id}/files?path=notes.txt",
        b"from a viewer",
        content_type="application/octet-stream",
        HTTP_X_CSRFTOKEN=token,
    )
    assert upload.status_code == 403
    assert browser.get(f"/api/desktops/{running.id}/files?path=.bashrc").status_code == 403
    assert not AuditEvent.objects.filter(action__startswith="desktop.file").exists()

    # The same request from a member passes the role check, and says why a stopped desktop takes none.
    browser.force_login(members[Role.MEMBER].user)
    page = browser.get(f"/desktops/{running.id}/").content.decode()
    assert 'id="upload-form"' in page and f'data-transfer-max-mib="{plan.transfer_max_mib}"' in page
    running.state = DesktopState.STOPPED
    running.save(update_fields=["state"])
    refused = browser.put(
        f"/api/desktops/{running.id}/files?path=notes.txt",
        b"from a member",
        content_type="application/octet-stream",
        HTTP_X_CSRFTOKEN=browser.cookies["csrftoken"].value,
    )
    assert refused.status_code == 409 and "stopped" in refused.json()["error"]["message"]
