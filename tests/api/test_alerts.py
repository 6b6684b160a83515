"""Alerts through the REST API and the pages: each rule raises one alert per cause, shown to the workspace
and nobody else, acknowledged once by a role that may take control, never by a viewer. The engine is the
directory test double (its readings set by the test); real packets and memory: test_lxc_egress.py and
e2e/test_alerts.py."""

from datetime import timedelta

import psycopg
import pytest
from django.core import mail
from django.db import IntegrityError, connection
from django.test import Client
from django.utils import timezone

from desktops import alerts, chat, services
from desktops.audit import Actor
from desktops.models import Alert, AuditEvent, ChatMessage, Desktop, Role, WebhookDelivery
from tests.conftest import client_for
from tests.factories import DesktopFactory

pytestmark = pytest.mark.django_db
MIB = 1024**2


def kinds(desktop) -> list[tuple[str, str]]:
    return sorted(Alert.objects.filter(desktop=desktop).values_list("kind", "status"))


def fail(desktop, reason="The desktop could not be started."):
    Desktop.objects.filter(id=desktop.id).update(
        state="error", last_error=reason, state_changed_at=timezone.now()
    )


@pytest.fixture
def broken(workspace):
    desktop = DesktopFactory(workspace=workspace, state="running", name="broken")
    fail(desktop)
    return desktop


def test_a_desktop_in_error_raises_one_alert_until_it_fails_anew(members, workspace, broken):
    workspace.approval_webhook_url = "https://hooks.example.com/le-bureau"
    workspace.save()
    assert alerts.alerts_evaluate() == {"error": 1}
    assert alerts.alerts_evaluate() == {}
    alert = Alert.objects.get(desktop=broken)
    member = client_for(members[Role.MEMBER])
    shown = member.get(f"/api/alerts/{alert.id}").json()
    assert (shown["kind"], shown["status"], shown["desktopName"]) == ("error", "open", "broken")
    assert shown["message"] == "broken is in error: The desktop could not be started."
    told = WebhookDelivery.objects.get(event="alert.raised")
    assert told.payload["alert"]["id"] == alert.id

    acknowledged = member.post(f"/api/alerts/{alert.id}/acknowledge")
    assert acknowledged.status_code == 200, acknowledged.content
    assert acknowledged.json()["acknowledgedBy"] == members[Role.MEMBER].user.email
    assert client_for(members[Role.OWNER]).post(f"/api/alerts/{alert.id}/acknowledge").status_code == 409
    assert AuditEvent.objects.filter(action="alert.acknowledged", target=broken.id).count() == 1
    # Still in error, for the same cause: seen to, not raised again.
    assert alerts.alerts_evaluate() == {}
    # Started and failed again: a new cause.
    fail(broken, "The desktop could not be started again.")
    assert alerts.alerts_evaluate() == {"error": 1}
    assert kinds(broken) == [("error", "acknowledged"), ("error", "open")]


def test_the_database_keeps_one_open_alert_per_rule_and_one_per_cause(broken):
    alerts.alerts_evaluate()
    with pytest.raises(IntegrityError):
        Alert.objects.create(workspace_id=broken.workspace_id, desktop=broken, kind="error", cause="other")


def test_one_evaluation_runs_at_a_time(broken):
    db = connection.settings_dict
    with psycopg.connect(host=db["HOST"], port=db["PORT"], user=db["USER"], dbname=db["NAME"]) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [alerts.EVALUATION_LOCK])
        assert alerts.alerts_evaluate() == {}
        other.execute("SELECT pg_advisory_unlock(%s)", [alerts.EVALUATION_LOCK])
    assert alerts.alerts_evaluate() == {"error": 1}


def test_viewers_read_alerts_and_outsiders_see_none(members, workspace, broken):
    alerts.alerts_evaluate()
    alert = Alert.objects.get(desktop=broken)
    viewer = client_for(members[Role.VIEWER])
    assert [a["id"] for a in viewer.get("/api/alerts?status=open").json()["results"]] == [alert.id]
    assert viewer.post(f"/api/alerts/{alert.id}/acknowledge").status_code == 403
    outsider = client_for(members["outsider"])
    assert outsider.get("/api/alerts").json()["results"] == []
    assert outsider.get(f"/api/alerts/{alert.id}").status_code == 404
    assert outsider.post(f"/api/alerts/{alert.id}/acknowledge").status_code == 404
    assert outsider.get(f"/api/alerts?workspace={workspace.id}").status_code == 404
    assert Alert.objects.get(id=alert.id).status == "open"


def test_acknowledging_needs_the_role_that_may_take_control(members, workspace, broken):
    workspace.control_role = Role.ADMIN
    workspace.save()
    alerts.alerts_evaluate()
    alert = Alert.objects.get(desktop=broken)
    assert client_for(members[Role.MEMBER]).post(f"/api/alerts/{alert.id}/acknowledge").status_code == 403
    assert client_for(members[Role.ADMIN]).post(f"/api/alerts/{alert.id}/acknowledge").status_code == 200


def test_the_list_filters_by_status_kind_and_desktop(members, workspace, broken):
    other = DesktopFactory(workspace=workspace, state="starting")
    Desktop.objects.filter(id=other.id).update(state_changed_at=timezone.now() - timedelta(hours=1))
    assert alerts.alerts_evaluate() == {"error": 1, "stuck": 1}
    owner = client_for(members[Role.OWNER])

    def listed(query):
        return sorted(a["kind"] for a in owner.get(f"/api/alerts?{query}").json()["results"])

    assert listed(f"workspace={workspace.id}") == ["error", "stuck"]
    assert listed("kind=stuck") == ["stuck"]
    assert listed(f"desktop={broken.id}") == ["error"]
    assert listed("status=acknowledged") == []
    assert owner.get("/api/alerts?kind=nonsense").status_code == 400


def test_a_step_stuck_past_its_deadline_but_not_one_a_worker_is_on(workspace, settings):
    long_ago = timezone.now() - timedelta(seconds=settings.LIFECYCLE_REQUEUE_AFTER + 10)
    stuck = DesktopFactory(workspace=workspace, state="stopping")
    busy = DesktopFactory(workspace=workspace, state="stopping")
    Desktop.objects.filter(id__in=[stuck.id, busy.id]).update(state_changed_at=long_ago)
    Desktop.objects.filter(id=busy.id).update(step_until=timezone.now() + timedelta(minutes=5))
    assert alerts.alerts_evaluate() == {"stuck": 1}
    alert = Alert.objects.get()
    assert alert.desktop_id == stuck.id
    assert "stop step" in alerts.alert_message(alert)


def test_a_failed_turn_and_a_turn_nobody_follows_raise_agent_alerts(members, workspace, settings):
    desktop = DesktopFactory(workspace=workspace)
    ChatMessage.objects.create(
        desktop=desktop,
        author="agent",
        status="error",
        content='Error: No API key found for provider "openai".',
        completed_at=timezone.now(),
    )
    assert alerts.alerts_evaluate() == {"agent": 1}
    alert = Alert.objects.get()
    assert alerts.alert_message(alert).startswith(
        f"The agent of {desktop.name} failed: No LLM key for OpenAI"
    )
    alerts.alert_acknowledge(actor=_owner_actor(workspace), alert_id=alert.id)
    silent = ChatMessage.objects.create(
        desktop=desktop,
        author="agent",
        status="running",
        heartbeat_at=timezone.now() - timedelta(seconds=alerts.SILENT_AFTER * settings.CHAT_STALE_AFTER + 1),
    )
    assert alerts.alerts_evaluate() == {"agent": 1}
    assert Alert.objects.get(status="open").cause == f"silent:{silent.id}"


def test_a_turn_far_longer_than_usual_counted_from_its_start(members, workspace, settings):
    settings.CHAT_STALE_AFTER = 3600  # its follower is there all along: only its length is in question
    desktop = DesktopFactory(workspace=workspace)
    now = timezone.now()
    for minutes in (2, 3, 4):
        done = ChatMessage.objects.create(desktop=desktop, author="agent", status="done", completed_at=now)
        # Each waited an hour, queued, before it started: not the agent's time.
        ChatMessage.objects.filter(id=done.id).update(
            created_at=now - timedelta(minutes=60 + minutes), started_at=now - timedelta(minutes=minutes)
        )
    workspace.alert_thresholds = {"long_turn_minimum": 60}
    workspace.save()
    # Queued for two hours behind other turns, then started by a worker now.
    reply = services.chat_send(actor=_owner_actor(workspace), desktop=desktop, message="Lance les tests")
    ChatMessage.objects.filter(id=reply.id).update(created_at=now - timedelta(hours=2))
    assert chat.chat_claim_next(desktop_id=desktop.id) == reply
    assert alerts.alerts_evaluate() == {}
    assert alerts.alerts_evaluate(now=now + timedelta(minutes=14)) == {}  # under 5 times the usual 3 minutes
    assert alerts.alerts_evaluate(now=now + timedelta(minutes=16)) == {"long_turn": 1}
    assert "has run for 16 minutes; turns usually take 3" in alerts.alert_message(Alert.objects.get())


def test_resources_above_the_thresholds_for_a_while(members, workspace, driver, plan):
    desktop = DesktopFactory(workspace=workspace, plan=plan)  # 1 vCPU, 2048 MiB, 10 GiB
    driver.plant(desktop.id)
    driver.set_disk_usage(desktop.id, 1024**3)
    workspace.alert_thresholds = {"memory_percent": 50, "cpu_percent": 80, "sustained_seconds": 60}
    workspace.save()
    start = timezone.now()

    def at(seconds, memory_mib, cpu_seconds):
        driver.set_usage(desktop.id, memory_mib * MIB, cpu_seconds)
        return alerts.alerts_evaluate(now=start + timedelta(seconds=seconds))

    assert at(0, 1500, 0) == {}  # above, but not for a minute yet
    assert at(30, 1500, 29) == {}
    assert at(45, 500, 44) == {}  # a dip: the spell starts again
    assert at(60, 1500, 59) == {}
    assert at(120, 1500, 118) == {"memory": 1, "cpu": 1}
    memory = Alert.objects.get(kind="memory")
    assert memory.detail == {"value": 73, "limit": 50}
    assert alerts.alert_message(memory) == f"{desktop.name} uses 73% of its plan's memory (alert from 50%)."
    assert at(150, 1500, 148) == {}  # the same spell, still open
    alerts.alert_acknowledge(actor=_owner_actor(workspace), alert_id=memory.id)
    assert at(180, 1500, 178) == {}  # the same spell, seen to
    assert at(210, 100, 179) == {}
    assert at(240, 1500, 180) == {}
    assert at(300, 1500, 181) == {"memory": 1}  # a new spell, a minute long
    # The disk fills past the workspace's default share, for a while too.
    driver.set_disk_usage(desktop.id, 95 * 1024**3 // 10)
    assert at(330, 100, 182) == {}
    assert at(390, 100, 183) == {"disk": 1}
    disk = Alert.objects.get(kind="disk")
    assert alerts.alert_message(disk) == f"{desktop.name} fills 95% of its plan's disk (alert from 90%)."


def test_blocked_attempts_are_counted_per_destination_and_a_burst_raises_an_alert(members, workspace, driver):
    desktop = DesktopFactory(workspace=workspace)
    driver.plant(desktop.id)
    workspace.alert_thresholds = {"blocked_per_minute": 20}
    workspace.save()
    start = timezone.now()

    def at(seconds, names, addresses):
        driver.set_blocked(desktop.id, names, addresses)
        return alerts.alerts_evaluate(now=start + timedelta(seconds=seconds))

    assert at(0, {"blocked.test": 1}, {"203.0.113.9": 3}) == {}  # counted; no rate without an earlier reading
    assert at(30, {"blocked.test": 2}, {"203.0.113.9": 5}) == {}  # 3 in half a minute
    # The engine forgot the address and counts it again from nothing: 1 + 2 + 9 in half a minute.
    assert at(60, {"blocked.test": 3}, {"203.0.113.9": 2, "198.51.100.7": 9}) == {"egress": 1}
    listed = client_for(members[Role.VIEWER]).get(f"/api/desktops/{desktop.id}/blocked").json()["results"]
    counts = {(b["via"], b["destination"]): b["attempts"] for b in listed}
    assert counts == {
        ("name", "blocked.test"): 3,
        ("address", "203.0.113.9"): 7,
        ("address", "198.51.100.7"): 9,
    }
    alert = Alert.objects.get()
    assert alert.detail == {"value": 24, "limit": 20}
    # A resolver's log cut shrinks its count: nothing new, nothing lost.
    assert at(90, {"blocked.test": 1}, {"203.0.113.9": 2, "198.51.100.7": 9}) == {}
    assert Desktop.objects.get(id=desktop.id).blocked_attempts.get(destination="blocked.test").attempts == 3
    outsider = client_for(members["outsider"])
    assert outsider.get(f"/api/desktops/{desktop.id}/blocked").status_code == 404


def test_a_burst_of_commands_raises_one_alert_per_burst(members, workspace, driver):
    desktop = DesktopFactory(workspace=workspace, name="busy")
    driver.plant(desktop.id)
    workspace.alert_thresholds = {"commands_per_minute": 20}
    workspace.save()
    start = timezone.now()

    def at(seconds, commands):
        if commands:  # as the guest endpoint records the agent runtime's report
            alerts.agent_commands_record(desktop=desktop, commands=commands)
        return alerts.alerts_evaluate(now=start + timedelta(seconds=seconds))

    assert at(0, 500) == {}  # all the commands before: no rate without an earlier reading
    assert at(30, 5) == {}  # 10 a minute
    assert at(60, 15) == {"commands": 1}  # 30 a minute
    alert = Alert.objects.get()
    assert alert.detail == {"value": 30, "limit": 20}
    assert alerts.alert_message(alert) == "The agent of busy ran 30 commands a minute (alert from 20)."
    assert at(90, 40) == {}  # the same burst, still open
    alerts.alert_acknowledge(actor=_owner_actor(workspace), alert_id=alert.id)
    assert at(120, 40) == {}  # the same burst, seen to
    assert at(150, 0) == {}  # calm again
    assert at(180, 11) == {"commands": 1}  # a new burst
    # A stopped desktop runs nothing: its next start begins with a reading, not with a rate.
    Desktop.objects.filter(id=desktop.id).update(state="stopped")
    assert at(210, 0) == {}
    Desktop.objects.filter(id=desktop.id).update(state="running")
    Alert.objects.filter(status="open").update(status="acknowledged")
    assert at(240, 30) == {}
    listed = client_for(members[Role.VIEWER]).get("/api/alerts?kind=commands").json()["results"]
    assert [a["kind"] for a in listed] == ["commands", "commands"]


def test_a_destroyed_desktops_alerts_are_resolved_and_leave_the_counts(members, workspace, broken):
    workspace.approval_webhook_url = "https://hooks.example.com/le-bureau"
    workspace.save()
    other = DesktopFactory(workspace=workspace, state="starting", name="slow")
    Desktop.objects.filter(id=other.id).update(state_changed_at=timezone.now() - timedelta(hours=1))
    assert alerts.alerts_evaluate() == {"error": 1, "stuck": 1}
    gone = Alert.objects.get(desktop=broken)
    member = Client()
    member.force_login(members[Role.MEMBER].user)
    assert 'title="open alerts">2</span>' in member.get(f"/w/{workspace.id}/alerts/").content.decode()

    # Destroyed by another way than its destroy step (reconcile ends a stuck destroy): the next
    # evaluation resolves its alerts, once, and raises none for it.
    Desktop.objects.filter(id=broken.id).update(state="destroyed")
    assert alerts.alerts_evaluate() == {}
    gone.refresh_from_db()
    assert (gone.status, gone.resolution, gone.acknowledged_by) == ("resolved", "desktop_destroyed", None)
    assert gone.resolved_at is not None
    assert alerts.alerts_open_count(workspace_id=workspace.id) == 1
    assert alerts.alerts_resolve_destroyed() == 0
    assert AuditEvent.objects.filter(action="alert.resolved", target=broken.id).count() == 1
    told = WebhookDelivery.objects.get(event="alert.resolved").payload["alert"]
    assert (told["id"], told["status"], told["resolution"]) == (gone.id, "resolved", "desktop_destroyed")

    page = member.get(f"/w/{workspace.id}/alerts/").content.decode()
    assert 'title="open alerts">1</span>' in page and "broken is in error" not in page
    resolved = member.get(f"/w/{workspace.id}/alerts/?status=resolved&fragment=1").content.decode()
    assert "broken is in error" in resolved and "The desktop was destroyed." in resolved
    assert f"/alerts/{gone.id}/acknowledge/" not in resolved
    api = client_for(members[Role.MEMBER])
    assert [a["kind"] for a in api.get("/api/alerts?status=open").json()["results"]] == ["stuck"]
    shown = api.get(f"/api/alerts/{gone.id}").json()
    assert (shown["status"], shown["resolution"]) == ("resolved", "desktop_destroyed")
    assert api.post(f"/api/alerts/{gone.id}/acknowledge").status_code == 409
    assert Alert.objects.get(id=gone.id).acknowledged_by is None
    # An outsider learns nothing of it.
    assert client_for(members["outsider"]).get(f"/api/alerts/{gone.id}").status_code == 404


def test_thresholds_are_the_workspace_admins_and_checked(members, workspace):
    owner = client_for(members[Role.OWNER])
    shown = owner.get(f"/api/workspaces/{workspace.id}").json()["alertThresholds"]
    assert shown["memoryPercent"] == 90 and shown["sustainedSeconds"] == 300
    body = {"alertThresholds": {"memoryPercent": 75}}
    assert (
        client_for(members[Role.MEMBER])
        .patch(f"/api/workspaces/{workspace.id}", body, format="json")
        .status_code
        == 403
    )
    changed = owner.patch(f"/api/workspaces/{workspace.id}", body, format="json")
    assert changed.status_code == 200, changed.content
    assert changed.json()["alertThresholds"]["memoryPercent"] == 75
    assert changed.json()["alertThresholds"]["cpuPercent"] == 90
    refused = owner.patch(
        f"/api/workspaces/{workspace.id}", {"alertThresholds": {"memoryPercent": 0}}, format="json"
    )
    assert refused.status_code == 400, refused.content
    assert AuditEvent.objects.get(action="workspace.alert_thresholds").detail == {"memory_percent": 75}


def test_the_people_who_may_take_control_are_told_by_email(members, broken):
    alerts.alerts_evaluate()
    told = alerts.alert_email(alert_id=Alert.objects.get().id)
    emails = {m.to[0] for m in mail.outbox}
    assert told == 3 and emails == {members[r].user.email for r in (Role.OWNER, Role.ADMIN, Role.MEMBER)}
    assert "broken is in error" in mail.outbox[0].body


def test_the_alerts_page_filters_and_acknowledges_and_the_navigation_counts(members, workspace, broken):
    alerts.alerts_evaluate()
    alert = Alert.objects.get()
    viewer = Client()
    viewer.force_login(members[Role.VIEWER].user)
    page = viewer.get(f"/w/{workspace.id}/alerts/").content.decode()
    assert "broken is in error" in page and 'title="open alerts">1</span>' in page
    assert "alert_acknowledge" not in page and f"/alerts/{alert.id}/acknowledge/" not in page
    assert viewer.post(f"/alerts/{alert.id}/acknowledge/").status_code == 302
    assert Alert.objects.get(id=alert.id).status == "open"
    assert "No alert." in viewer.get(f"/w/{workspace.id}/alerts/?kind=memory&fragment=1").content.decode()
    outsider = Client()
    outsider.force_login(members["outsider"].user)
    assert outsider.get(f"/w/{workspace.id}/alerts/").status_code == 404
    assert outsider.post(f"/alerts/{alert.id}/acknowledge/").status_code == 404
    member = Client()
    member.force_login(members[Role.MEMBER].user)
    assert f"/alerts/{alert.id}/acknowledge/" in member.get(f"/w/{workspace.id}/alerts/").content.decode()
    done = member.post(f"/alerts/{alert.id}/acknowledge/", headers={"X-Requested-With": "fetch"})
    assert done.status_code == 204
    assert Alert.objects.get(id=alert.id).status == "acknowledged"
    shown = member.get(f"/w/{workspace.id}/alerts/?status=acknowledged").content.decode()
    assert f"acknowledged by {members[Role.MEMBER].user.email}" in shown


def test_admins_set_the_thresholds_in_settings(members, workspace):
    admin = Client()
    admin.force_login(members[Role.ADMIN].user)
    form = {name: t.default for name, t in alerts.THRESHOLDS.items()} | {"disk_percent": 80}
    assert admin.post(f"/w/{workspace.id}/settings/alerts/", form).status_code == 302
    workspace.refresh_from_db()
    assert alerts.thresholds_of(workspace)["disk_percent"] == 80
    refused = admin.post(f"/w/{workspace.id}/settings/alerts/", form | {"disk_percent": 101})
    assert refused.status_code == 400
    member = Client()
    member.force_login(members[Role.MEMBER].user)
    member.post(f"/w/{workspace.id}/settings/alerts/", form | {"disk_percent": 10})
    workspace.refresh_from_db()
    assert alerts.thresholds_of(workspace)["disk_percent"] == 80


def _owner_actor(workspace):
    return Actor(user=workspace.memberships.get(role=Role.OWNER).user)
