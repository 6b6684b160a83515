"""Fleets through the API: bulk create all or none against the quota, bulk actions and labels that never
leave their workspace, commands for the control role only, and scheduled messages that run once however
many times they were missed. Desktops are rows here (no worker): what the workers then do is in
tests/sdk/test_sdk_stack.py."""

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import Subscription
from desktops import schedules
from desktops.audit import Actor
from desktops.models import AuditEvent, ChatMessage, Desktop, DesktopLabel, Role, Schedule, ScheduleRun
from tests.conftest import client_for
from tests.factories import DesktopFactory, MembershipFactory, TierFactory, api_key_for

pytestmark = pytest.mark.django_db


@pytest.fixture
def member_api(members):
    return client_for(key=api_key_for(members[Role.MEMBER]))


def _tier(workspace, **quotas):
    Subscription.objects.update_or_create(workspace=workspace, defaults={"tier": TierFactory(**quotas)})


def test_bulk_create_is_all_or_nothing_against_the_quota(member_api, workspace, plan):
    _tier(workspace, max_desktops=4, max_running=10)
    DesktopFactory(workspace=workspace, plan=plan, name="ci-7")
    body = {"workspaceId": workspace.id, "namePrefix": "ci", "count": 4, "labels": ["CI", "team-a"]}
    refused = member_api.post("/api/desktops/bulk", body, format="json")
    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "quota_exceeded"
    assert error[
        "message"
    ] == "1 of 4 desktops on the tier-0 tier: 4 more would go past it; none made.".replace(
        "tier-0", Subscription.objects.get(workspace=workspace).tier.name
    )
    assert workspace.desktops.count() == 1

    made = member_api.post("/api/desktops/bulk", {**body, "count": 3}, format="json")
    assert made.status_code == 201, made.content
    desktops = made.json()["desktops"]
    # Numbered on from the highest in use, labelled (lowercased), each queued for provisioning.
    assert [d["name"] for d in desktops] == ["ci-8", "ci-9", "ci-10"]
    assert all(d["labels"] == ["ci", "team-a"] and d["state"] == "provisioning" for d in desktops)
    assert AuditEvent.objects.filter(action="desktop.create", workspace_id=workspace.id).count() == 3


def test_bulk_create_counts_the_running_quota_and_a_taken_name_undoes_the_batch(member_api, workspace, plan):
    _tier(workspace, max_desktops=10, max_running=2)
    DesktopFactory(workspace=workspace, plan=plan, name="web")
    body = {"workspaceId": workspace.id, "names": ["a", "b"]}
    refused = member_api.post("/api/desktops/bulk", body, format="json").json()["error"]
    assert refused["code"] == "quota_exceeded" and "running desktops" in refused["message"]
    _tier(workspace, max_desktops=10, max_running=10)
    taken = member_api.post("/api/desktops/bulk", {**body, "names": ["a", "web"]}, format="json")
    assert taken.status_code == 400
    assert set(workspace.desktops.values_list("name", flat=True)) == {"web"}


def test_bulk_actions_by_label_stay_in_their_workspace(workspace, members, plan):
    """One person in two workspaces, the same label in both: a bulk stop of one touches only its own."""
    person = members[Role.MEMBER]
    other = MembershipFactory(user=person.user, role=Role.OWNER)
    mine = [DesktopFactory(workspace=workspace, plan=plan) for _ in range(2)]
    theirs = DesktopFactory(workspace=other.workspace, plan=plan)
    outsiders = DesktopFactory(workspace=members["outsider"].workspace, plan=plan)
    for desktop in [*mine, theirs, outsiders]:
        DesktopLabel.objects.create(desktop=desktop, name="ci")
    api = client_for(person)

    listed = api.get(f"/api/desktops?workspace={workspace.id}&label=ci").json()
    assert {d["id"] for d in listed["results"]} == {d.id for d in mine}
    body = {"workspaceId": workspace.id, "labels": ["ci"], "ids": [mine[0].id, theirs.id, outsiders.id]}
    result = api.post("/api/desktops/bulk/stop", body, format="json").json()
    assert result["done"] == 1 and result["refused"] == 2
    by_id = {r["desktopId"]: r for r in result["results"]}
    assert by_id[mine[0].id]["state"] == "stopping"
    # Another workspace's desktop, the person's own or not, is "not found" like one that does not exist.
    assert by_id[theirs.id]["code"] == by_id[outsiders.id]["code"] == "not_found"
    assert Desktop.objects.get(id=theirs.id).state == Desktop.objects.get(id=outsiders.id).state == "running"
    assert Desktop.objects.get(id=mine[1].id).state == "running"

    everything = api.post(
        "/api/desktops/bulk/suspend", {"workspaceId": workspace.id, "all": True}, format="json"
    )
    assert [r["ok"] for r in sorted(everything.json()["results"], key=lambda r: r["name"])] == [
        d.id == mine[1].id for d in sorted(mine, key=lambda d: d.name)
    ]
    nothing = api.post("/api/desktops/bulk/stop", {"workspaceId": workspace.id}, format="json")
    assert nothing.status_code == 400  # no selection is not "everything"


def test_viewers_and_outsiders_cannot_act_on_a_fleet(workspace, members, plan):
    desktop = DesktopFactory(workspace=workspace, plan=plan)
    body = {"workspaceId": workspace.id, "ids": [desktop.id]}
    for role, status in ((Role.VIEWER, 403), ("outsider", 404)):
        api = client_for(key=api_key_for(members[role]))
        assert api.post("/api/desktops/bulk/destroy", body, format="json").status_code == status
        assert (
            api.post("/api/desktops/bulk/labels", {**body, "add": ["x"]}, format="json").status_code == status
        )
    outsider = client_for(key=api_key_for(members["outsider"]))
    assert outsider.get(f"/api/desktops?label=ci&workspace={workspace.id}").status_code == 404
    assert Desktop.objects.get(id=desktop.id).state == "running" and not desktop.labels.exists()


def test_a_member_who_may_not_take_control_destroys_nothing(member_api, workspace, plan):
    workspace.control_role = Role.ADMIN
    workspace.save()
    desktops = [DesktopFactory(workspace=workspace, plan=plan) for _ in range(2)]
    one = member_api.delete(f"/api/desktops/{desktops[0].id}")
    assert one.status_code == 403 and "Admin" in one.json()["error"]["message"]
    everything = member_api.post(
        "/api/desktops/bulk/destroy", {"workspaceId": workspace.id, "all": True}, format="json"
    ).json()
    assert everything["done"] == 0 and {r["code"] for r in everything["results"]} == {"permission_denied"}
    assert set(Desktop.objects.filter(workspace=workspace).values_list("state", flat=True)) == {"running"}
    # Stopping is still theirs: it loses nothing.
    assert member_api.post(f"/api/desktops/{desktops[0].id}/stop").status_code == 202


def test_labels_are_checked_counted_and_removed(member_api, workspace, plan):
    desktop = DesktopFactory(workspace=workspace, plan=plan)
    url = f"/api/desktops/{desktop.id}/labels"
    bad = member_api.post(url, {"add": ["no spaces"]}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["fields"]["labels"]
    assert member_api.post(url, {"add": ["env=prod", "ci"]}, format="json").json()["labels"] == [
        "ci",
        "env=prod",
    ]
    assert member_api.post(url, {"add": [f"l{i}" for i in range(19)]}, format="json").status_code == 400
    assert member_api.post(url, {"remove": ["ci"]}, format="json").json()["labels"] == ["env=prod"]
    counts = member_api.get(f"/api/workspaces/{workspace.id}/labels").json()["results"]
    assert counts == [{"name": "env=prod", "desktops": 1}]


def test_commands_need_the_control_role_and_a_running_desktop(workspace, members, plan):
    desktop = DesktopFactory(workspace=workspace, plan=plan, state="stopped")
    url = f"/api/desktops/{desktop.id}/exec"
    member = client_for(key=api_key_for(members[Role.MEMBER]))
    stopped = member.post(url, {"command": "id"}, format="json")
    assert stopped.status_code == 409 and "start it first" in stopped.json()["error"]["message"]
    assert member.post(url, {"command": "id", "argv": ["id"]}, format="json").status_code == 400
    workspace.control_role = Role.ADMIN
    workspace.save()
    assert member.post(url, {"command": "id"}, format="json").status_code == 403
    assert not AuditEvent.objects.filter(action="desktop.exec").exists()


def test_schedules_refuse_what_cannot_run(member_api, workspace, plan):
    url = f"/api/desktops/{DesktopFactory(workspace=workspace, plan=plan).id}/schedules"
    for body, field in (
        ({"cron": "every day", "message": "x"}, "cron"),
        ({"cron": "* * * * *", "message": "x"}, "cron"),  # every minute: too often
        ({"cron": "0 9 * * *", "message": "x", "timezone": "Mars/Olympus"}, "timezone"),
        ({"cron": "0 9 * * *", "message": "   "}, "message"),
        ({"cron": "0 0 30 2 *", "message": "x"}, "cron"),  # 30 February: valid fields, no date
    ):
        answer = member_api.post(url, body, format="json")
        assert answer.status_code == 400 and field in answer.json()["error"]["fields"], body
    made = member_api.post(
        url, {"cron": "0 9 * * 1-5", "message": "Bilan", "timezone": "Europe/Paris"}, format="json"
    )
    next_run = timezone.datetime.fromisoformat(made.json()["nextRunAt"])
    assert next_run.astimezone(timezone.get_fixed_timezone(0)).hour in (7, 8)  # 9:00 in Paris


def test_a_schedule_missed_for_hours_runs_once(workspace, members, plan):
    desktop = DesktopFactory(workspace=workspace, plan=plan)
    schedule = Schedule.objects.create(
        desktop=desktop,
        cron="*/5 * * * *",
        message="Surveille le pipeline",
        created_by=members[Role.MEMBER].user,
        next_run_at=timezone.now() - timedelta(hours=3),  # 36 runs missed while the control plane was down
    )
    claimed = schedules.schedules_claim()
    assert schedules.schedules_claim() == []  # a second beat finds nothing due
    assert len(claimed) == 1 and ScheduleRun.objects.filter(schedule=schedule).count() == 1
    schedule.refresh_from_db()
    assert timezone.now() < schedule.next_run_at <= timezone.now() + timedelta(minutes=5)


def test_a_run_starts_a_stopped_desktop_then_sends_and_stops_it_after_the_answer(workspace, members, plan):
    desktop = DesktopFactory(workspace=workspace, plan=plan, state="stopped")
    schedule = Schedule.objects.create(
        desktop=desktop,
        cron="0 * * * *",
        message="Rapport",
        stop_after=True,
        created_by=members[Role.MEMBER].user,
        next_run_at=timezone.now(),
    )
    [run_id] = schedules.schedules_claim()
    assert schedules.schedule_fire(run_id=run_id) == schedules.WAITING
    assert Desktop.objects.get(id=desktop.id).state == "starting"
    starting = AuditEvent.objects.get(action="desktop.starting", target=desktop.id)
    assert starting.actor == f"schedule:{schedule.id} ({members[Role.MEMBER].user.email})"
    assert schedules.schedule_fire(run_id=run_id) == schedules.WAITING  # still on its way up
    Desktop.objects.filter(id=desktop.id).update(state="running")
    assert schedules.schedule_fire(run_id=run_id) == schedules.FINISHED
    assert schedules.schedule_fire(run_id=run_id) == schedules.FINISHED  # a task delivered twice sends once
    run = ScheduleRun.objects.get(id=run_id)
    assert run.status == "sent" and run.reply.reply_to.content == "Rapport"
    assert ChatMessage.objects.filter(desktop=desktop, author="operator").count() == 1

    ChatMessage.objects.filter(id=run.reply_id).update(status="done")
    schedules.schedule_turn_ended(message_id=run.reply_id)
    assert ScheduleRun.objects.get(id=run_id).status == "done"
    assert Desktop.objects.get(id=desktop.id).state == "stopping"


def test_a_run_whose_author_lost_control_sends_nothing(workspace, members, plan):
    desktop = DesktopFactory(workspace=workspace, plan=plan)
    Schedule.objects.create(
        desktop=desktop,
        cron="0 * * * *",
        message="x",
        created_by=members[Role.MEMBER].user,
        next_run_at=timezone.now(),
    )
    workspace.control_role = Role.ADMIN
    workspace.save()
    [run_id] = schedules.schedules_claim()
    assert schedules.schedule_fire(run_id=run_id) == schedules.FINISHED
    run = ScheduleRun.objects.get(id=run_id)
    assert run.status == "failed" and "needs the Admin role" in run.error
    assert not ChatMessage.objects.filter(desktop=desktop).exists()


@pytest.mark.parametrize("gone", ["revoked", "expired", "deleted"])
def test_a_schedule_made_with_a_key_stops_with_the_key(member_api, members, workspace, plan, gone):
    desktop = DesktopFactory(workspace=workspace, plan=plan)
    made = member_api.post(
        f"/api/desktops/{desktop.id}/schedules", {"cron": "0 9 * * *", "message": "Bilan"}, format="json"
    )
    assert made.status_code == 201, made.content
    schedule = Schedule.objects.get(id=made.json()["id"])
    key = schedule.created_with_key
    assert key is not None and key.created_by == members[Role.MEMBER].user
    # The key leaks and is taken away; the schedule it made must not go on acting as its owner.
    if gone == "revoked":
        key.revoked_at = timezone.now()
        key.save()
    elif gone == "expired":
        key.expires_at = timezone.now() - timedelta(seconds=1)
        key.save()
    else:
        key.delete()
    Schedule.objects.filter(id=schedule.id).update(next_run_at=timezone.now())
    [run_id] = schedules.schedules_claim()
    assert schedules.schedule_fire(run_id=run_id) == schedules.FINISHED
    run = ScheduleRun.objects.get(id=run_id)
    assert run.status == "failed" and "API key that made the schedule" in run.error
    assert not ChatMessage.objects.filter(desktop=desktop).exists()

    # Edited by its author in person, it runs as them again.
    schedules.schedule_update(
        actor=Actor(user=members[Role.MEMBER].user), schedule=Schedule.objects.get(id=schedule.id)
    )
    Schedule.objects.filter(id=schedule.id).update(next_run_at=timezone.now())
    [run_id] = schedules.schedules_claim()
    assert schedules.schedule_fire(run_id=run_id) == schedules.FINISHED
    assert ScheduleRun.objects.get(id=run_id).status == "sent"
