"""The viewer's page: who watches a desktop and who has control, for the workspace's members only."""

from datetime import UTC, datetime

import pytest
import time_machine
from django.test import Client
from django.utils import timezone, translation
from django.utils.formats import date_format

from desktops.audit import SYSTEM, Actor
from desktops.lifecycle import transition
from desktops.models import AuditEvent, ChatMessage, DesktopState, LLMKey, Role
from desktops.relays import Kind, desktop_watchers, relay_closed, relay_ticket_claim, relay_tickets_mint
from desktops.schedules import schedule_create
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


FRENCH = {"HTTP_ACCEPT_LANGUAGE": "fr-FR,fr;q=0.9"}


def test_states_read_in_the_pages_language_while_the_api_keeps_their_values(client, members, workspace, plan):
    """State names were English on French pages, even inside French sentences ("Le bureau est stopped")."""
    stopped = DesktopFactory(workspace=workspace, state=DesktopState.STOPPED, name="arrete")
    client.force_login(members[Role.MEMBER].user)
    page = client.get(f"/desktops/{stopped.id}/", **FRENCH).content.decode()
    assert 'id="state" data-state="stopped">arrêté</span>' in page
    listed = client.get(f"/w/{workspace.id}/desktops/", **FRENCH).content.decode()
    assert 'data-state="stopped">arrêté</span>' in listed
    assert '<option value="suspended">suspendu</option>' in listed  # the state filter
    # What the page's script shows when a state changes comes from the same labels, carried by the page.
    assert (
        '<script id="state-labels" type="application/json">' in page
        and '"suspending": "en suspension"' in page
    )
    # The API's values stay the same in every language; its sentences speak the reader's.
    assert client.get(f"/api/desktops/{stopped.id}", **FRENCH).json()["state"] == "stopped"
    refused = client.post(
        f"/api/desktops/{stopped.id}/exec", {"command": "true"}, content_type="application/json", **FRENCH
    )
    assert refused.status_code == 409
    assert refused.json()["error"]["message"] == "Le bureau est arrêté : démarrez-le d'abord."


def test_a_destroyed_desktops_page_says_when_and_by_whom_and_offers_nothing_to_do(
    client, members, workspace, plan
):
    """It showed the whole viewer, its buttons and a screen said to come back when it runs again."""
    owner = members[Role.OWNER]
    gone = DesktopFactory(workspace=workspace, state=DesktopState.RUNNING, name="fini")
    transition(
        desktop_id=gone.id, sources={"running"}, target="destroying", actor=Actor(user=owner.user), reason=""
    )
    transition(desktop_id=gone.id, sources={"destroying"}, target="destroyed", actor=SYSTEM)
    gone.refresh_from_db()
    client.force_login(members[Role.MEMBER].user)
    page = client.get(f"/desktops/{gone.id}/", **FRENCH).content.decode()
    with translation.override("fr"):
        at = date_format(timezone.localtime(gone.state_changed_at), "DATETIME_FORMAT")
    assert f"Détruit le {at} par {owner.user.email}." in page
    assert "il ne peut plus démarrer" in page
    for control in ('id="lifecycle"', "data-action=", 'id="screen"', 'id="chat-form"', 'id="mode-control"'):
        assert control not in page, control
    assert "viewer.js" not in page
    assert page.count("<li><strong>") == 2 and "<strong>détruit</strong>" in page  # its timeline stays
    # An outsider still learns nothing of it.
    client.force_login(members["outsider"].user)
    assert client.get(f"/desktops/{gone.id}/").status_code == 404


def test_a_suspended_desktop_asks_to_be_resumed_not_started(client, members, workspace, plan):
    suspended = DesktopFactory(workspace=workspace, state=DesktopState.SUSPENDED)
    client.force_login(members[Role.MEMBER].user)
    page = client.get(f"/desktops/{suspended.id}/", **FRENCH).content.decode()
    assert "Le bureau est suspendu : reprenez-le pour envoyer des messages" in page
    assert "démarrez-le" not in page
    assert 'data-action="resume" data-when="suspended">' in page
    assert 'data-action="start" data-when="error stopped" hidden>' in page


def test_with_no_llm_key_the_chat_says_what_to_do_before_and_after_sending(client, members, workspace, plan):
    """The chat said "L'agent travaille…" and nothing told a newcomer that the agent needs a key first."""
    full = DesktopFactory(workspace=workspace, state=DesktopState.RUNNING, image_profile="full")
    client.force_login(members[Role.ADMIN].user)
    page = client.get(f"/desktops/{full.id}/", **FRENCH).content.decode()
    assert "L'agent répond une fois que l'espace de travail a une clé LLM" in page
    assert f'<a href="/w/{workspace.id}/settings/#llm-keys">Ajouter une clé LLM</a>' in page
    client.force_login(members[Role.MEMBER].user)
    page = client.get(f"/desktops/{full.id}/", **FRENCH).content.decode()
    assert "Demandez à un administrateur de l'espace de travail d'en ajouter une." in page
    sent = client.post(
        f"/api/desktops/{full.id}/chat",
        {"message": "Range le bureau"},
        content_type="application/json",
        **FRENCH,
    )
    assert sent.status_code == 202, sent.content
    assert sent.json()["status"] == "error"
    assert sent.json()["failure"] == {
        "kind": "llm_key_missing",
        "message": "Aucune clé LLM pour le fournisseur du modèle dans cet espace de travail : ajoutez-en une "
        "dans les Réglages.",
        "fixUrl": f"/w/{workspace.id}/settings/",
        "detail": "",  # nothing the runtime said: it was never asked
    }
    reply = ChatMessage.objects.get(id=sent.json()["id"])
    assert reply.completed_at is not None
    assert reply.reply_to.content == "Range le bureau"  # kept, to send again
    # With a key, or with an agent of the workspace's own, the notice goes and turns are queued.
    LLMKey.objects.create(
        workspace=workspace, provider="anthropic", name="k", secret_encrypted="-", last4="1234"
    )
    assert 'id="no-llm-key"' not in client.get(f"/desktops/{full.id}/").content.decode()
    queued = client.post(
        f"/api/desktops/{full.id}/chat", {"message": "Encore"}, content_type="application/json"
    )
    assert ChatMessage.objects.get(id=queued.json()["id"]).status == ChatMessage.Status.QUEUED


def test_a_schedule_reads_in_its_own_time_zone(client, members, workspace, plan, running):
    """A Europe/Paris schedule's next run was shown in UTC."""
    owner = members[Role.OWNER]
    with time_machine.travel(datetime(2026, 12, 4, 6, 0, tzinfo=UTC), tick=False):
        schedule_create(
            actor=Actor(user=owner.user),
            desktop=running,
            cron="0 9 * * *",
            message="Bonjour",
            tz="Europe/Paris",
        )
        client.force_login(owner.user)
        page = client.get(f"/desktops/{running.id}/").content.decode()
    assert "next 2026-12-04 09:00 CET" in page
