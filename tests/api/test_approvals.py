"""Approvals through the REST API: who sees the queue, who may answer, and that the first answer stands.
Every attack tried: a viewer answering, an outsider looking or answering, a role below the policy's."""

from datetime import timedelta

import pytest
from django.utils import timezone

from desktops import approvals, chat, services
from desktops.audit import Actor
from desktops.models import Approval, AuditEvent, Role
from tests.conftest import client_for
from tests.factories import DesktopFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def asked(workspace):
    desktop = DesktopFactory(workspace=workspace, state="running", name="deployer")
    return approvals.approval_request(desktop=desktop, title="git push --force", details="main", cwd="/srv")


def test_members_see_the_queue_and_outsiders_see_nothing(members, asked):
    for role in Role:
        listed = client_for(members[role]).get("/api/approvals?status=pending")
        assert [a["id"] for a in listed.json()["results"]] == [asked.id], role
    first = listed.json()["results"][0]
    assert (first["title"], first["desktopName"], first["cwd"], first["status"]) == (
        "git push --force",
        "deployer",
        "/srv",
        "pending",
    )
    outsider = client_for(members["outsider"])
    assert outsider.get("/api/approvals").json()["results"] == []
    assert outsider.get(f"/api/approvals/{asked.id}").status_code == 404
    assert outsider.get(f"/api/approvals?workspace={asked.desktop.workspace_id}").status_code == 404


def test_a_viewer_and_an_outsider_cannot_answer(members, asked):
    viewer = client_for(members[Role.VIEWER]).post(f"/api/approvals/{asked.id}/approve", {}, format="json")
    assert viewer.status_code == 403, viewer.content
    outsider = client_for(members["outsider"]).post(f"/api/approvals/{asked.id}/deny", {}, format="json")
    assert outsider.status_code == 404, outsider.content
    assert Approval.objects.get(id=asked.id).status == "pending"


def test_the_workspace_policy_says_who_answers_and_the_first_answer_stands(members, workspace, asked):
    owner = client_for(members[Role.OWNER])
    policy = owner.patch(f"/api/workspaces/{workspace.id}", {"approvalRole": "admin"}, format="json")
    assert policy.status_code == 200 and policy.json()["approvalRole"] == "admin", policy.content
    member = client_for(members[Role.MEMBER]).post(f"/api/approvals/{asked.id}/approve", {}, format="json")
    assert member.status_code == 403, member.content
    admin = client_for(members[Role.ADMIN])
    denied = admin.post(f"/api/approvals/{asked.id}/deny", {"comment": "Pas sur main."}, format="json")
    assert denied.status_code == 200, denied.content
    assert (denied.json()["status"], denied.json()["comment"]) == ("denied", "Pas sur main.")
    assert denied.json()["decidedBy"] == members[Role.ADMIN].user.email
    again = owner.post(f"/api/approvals/{asked.id}/approve", {}, format="json")
    assert again.status_code == 409, again.content
    decided = AuditEvent.objects.get(action="approval.denied")
    assert (decided.target, decided.detail["comment"]) == (asked.desktop_id, "Pas sur main.")


def test_a_request_past_its_time_is_timed_out_for_everyone(members, asked):
    Approval.objects.filter(id=asked.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    shown = client_for(members[Role.MEMBER]).get(f"/api/approvals/{asked.id}").json()
    assert shown["status"] == "expired"
    late = client_for(members[Role.OWNER]).post(f"/api/approvals/{asked.id}/approve", {}, format="json")
    assert late.status_code == 409, late.content
    assert Approval.objects.get(id=asked.id).status == "expired"
    assert approvals.approvals_expire() == 0  # already refused, once


def test_the_policy_is_for_admins_and_checked(members, workspace):
    member = client_for(members[Role.MEMBER])
    refused = member.patch(f"/api/workspaces/{workspace.id}", {"approvalTimeout": 60}, format="json")
    assert refused.status_code == 403, refused.content
    owner = client_for(members[Role.OWNER])
    bad = owner.patch(f"/api/workspaces/{workspace.id}", {"approvalTimeout": 1}, format="json")
    assert bad.status_code == 400, bad.content
    good = owner.patch(f"/api/workspaces/{workspace.id}", {"approvalTimeout": 600}, format="json")
    assert good.json()["approvalTimeout"] == 600


def test_a_member_who_may_not_take_control_may_not_approve_whatever_the_policy_says(
    members, workspace, asked
):
    # The policy lets members answer, but only admins may take control: approving would let a member
    # make the agent do what they could not do themselves.
    workspace.approval_role, workspace.control_role = Role.MEMBER, Role.ADMIN
    workspace.save()
    member = client_for(members[Role.MEMBER]).post(f"/api/approvals/{asked.id}/approve", {}, format="json")
    assert member.status_code == 403 and "Admin" in member.json()["error"]["message"]
    assert Approval.objects.get(id=asked.id).status == "pending"
    assert approvals.approval_email(approval_id=asked.id) == 2  # the admin and the owner, not the member
    admin = client_for(members[Role.ADMIN]).post(f"/api/approvals/{asked.id}/approve", {}, format="json")
    assert admin.status_code == 200, admin.content


def test_the_people_who_may_answer_are_told_by_e_mail(members, workspace, asked, mailoutbox):
    workspace.approval_role = Role.ADMIN
    workspace.save()
    assert approvals.approval_email(approval_id=asked.id) == 2
    told = sorted(address for message in mailoutbox for address in message.to)
    assert told == sorted([members[Role.ADMIN].user.email, members[Role.OWNER].user.email])
    assert "git push --force" in mailoutbox[0].subject and "/srv" in mailoutbox[0].body
    assert f"/w/{workspace.id}/approvals/" in mailoutbox[0].body
    # Once answered, nobody is told it waits.
    approvals.approval_decide(actor=Actor(user=members[Role.OWNER].user), approval_id=asked.id, approve=True)
    assert approvals.approval_email(approval_id=asked.id) == 0


def test_an_agent_cannot_flood_its_approvers_mailboxes(members, workspace, settings, mailoutbox):
    """An agent asking without end used to mail its words to every approver, about 20 times a second."""
    settings.APPROVAL_EMAILS_PER_HOUR = 3
    desktop = DesktopFactory(workspace=workspace, state="running")
    asks = [approvals.approval_request(desktop=desktop, title=f"ask {n}", details="") for n in range(5)]
    told = [approvals.approval_email(approval_id=ask.id) for ask in asks]
    assert told[:3] == [told[0]] * 3 and told[0] > 0 and told[3:] == [0, 0]
    assert "agent's own wording" in mailoutbox[0].body
    assert "further requests this hour wait in the inbox" in mailoutbox[-1].body
    assert Approval.objects.filter(desktop=desktop, status="pending").count() == 5


def test_a_request_names_the_conversation_it_came_from(members, workspace):
    desktop = DesktopFactory(workspace=workspace, state="running")
    reply = services.chat_send(
        actor=Actor(user=members[Role.MEMBER].user), desktop=desktop, message="Mets en prod"
    )
    chat.chat_claim_next(desktop_id=desktop.id)
    asked = approvals.approval_request(desktop=desktop, title="kubectl apply")
    shown = client_for(members[Role.VIEWER]).get(f"/api/approvals/{asked.id}").json()
    assert shown["turn"] == reply.id
    page = client_for(members[Role.VIEWER]).get(f"/w/{workspace.id}/approvals/").content.decode()
    assert "Mets en prod" in page


def test_the_queue_filters_by_status_and_desktop(members, workspace, asked):
    other = approvals.approval_request(
        desktop=DesktopFactory(workspace=workspace, state="running"), title="B"
    )
    Approval.objects.filter(id=other.id).update(expires_at=timezone.now() - timedelta(seconds=1))
    client = client_for(members[Role.VIEWER])

    def ids(query: str) -> list[str]:
        return [a["id"] for a in client.get(f"/api/approvals?{query}").json()["results"]]

    assert ids("status=pending") == [asked.id]
    assert ids("status=expired") == [other.id]
    assert ids(f"desktop={other.desktop_id}") == [other.id]
    assert ids("status=approved") == []


def test_the_commands_that_wait_for_an_approval_are_the_workspaces_and_reach_its_desktops(
    members, workspace, django_capture_on_commit_callbacks, monkeypatch
):
    from desktops.agent_config import approvals_policy

    sent = []
    monkeypatch.setattr(
        "desktops.queue.current_app.send_task", lambda name, kwargs: sent.append((name, kwargs))
    )
    # Set explicitly from the start: OpenClaw's own default asks for nothing.
    assert approvals_policy(workspace) == {
        "commands": ["git push", "kubectl", "terraform apply", "sudo"],
        "timeout": 570,  # OpenClaw waits at most 600 s for the plugin: a 30-minute default is cut short
    }
    path = f"/api/workspaces/{workspace.id}"
    for role in (Role.VIEWER, Role.MEMBER):
        refused = client_for(members[role]).patch(path, {"approvalCommands": []}, format="json")
        assert refused.status_code == 403, refused.content
    owner = client_for(members[Role.OWNER])
    too_many = owner.patch(path, {"approvalCommands": [f"tool{i}" for i in range(51)]}, format="json")
    assert too_many.status_code == 400 and "approvalCommands" in too_many.json()["error"]["fields"]
    with django_capture_on_commit_callbacks(execute=True):
        response = owner.patch(
            path, {"approvalCommands": ["git  push", "", "helm upgrade", "git push"]}, format="json"
        )
    assert response.status_code == 200, response.content
    assert response.json()["approvalCommands"] == ["git push", "helm upgrade"]
    assert sent == [("workers.tasks.workspace_agent_configure", {"workspace_id": workspace.id})]
    workspace.refresh_from_db()
    assert approvals_policy(workspace)["commands"] == ["git push", "helm upgrade"]
    audited = AuditEvent.objects.get(action="workspace.approval_policy")
    assert audited.detail["commands"] == ["git push", "helm upgrade"]
    outsider = client_for(key=None)
    assert outsider.patch(path, {"approvalCommands": []}, format="json").status_code in (401, 403, 404)
