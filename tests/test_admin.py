"""Support staff use the Django admin; its lifecycle actions go through the same services."""

import pytest

from desktops.audit import SYSTEM, audit_record
from desktops.models import AuditEvent, DesktopState
from tests.factories import DesktopFactory, UserFactory


@pytest.fixture
def staff_client(client, db):
    client.force_login(UserFactory(is_staff=True, is_superuser=True, email="support@example.com"))
    return client


def test_stop_action_moves_running_desktops_and_reports_the_rest(staff_client, plan):
    running, stopped = DesktopFactory(), DesktopFactory(state=DesktopState.STOPPED)
    response = staff_client.post(
        "/admin/desktops/desktop/",
        {"action": "desktop_stop", "_selected_action": [running.id, stopped.id]},
        follow=True,
    )
    assert response.status_code == 200
    running.refresh_from_db()
    stopped.refresh_from_db()
    assert running.state == DesktopState.STOPPING and stopped.state == DesktopState.STOPPED
    messages = [str(m) for m in response.context["messages"]]
    assert any("Cannot stop a desktop that is stopped" in m for m in messages)
    assert AuditEvent.objects.filter(actor="support:support@example.com", action="desktop.stopping").exists()


@pytest.mark.parametrize("page", ["desktop", "workspace", "apikey", "llmkey", "auditevent", "plan"])
def test_admin_pages_open(staff_client, page, plan):
    DesktopFactory()
    assert staff_client.get(f"/admin/desktops/{page}/").status_code == 200


def test_audit_is_read_only_in_the_admin(staff_client):
    event = audit_record(actor=SYSTEM, action="test")
    assert staff_client.post(f"/admin/desktops/auditevent/{event.id}/delete/").status_code == 403
