"""Owner / admin / member / viewer / outsider on every endpoint, each through a real API key."""

from collections.abc import Callable
from dataclasses import dataclass

import pytest

from desktops import alerts, approvals
from desktops.models import Invitation, Role
from tests.conftest import client_for
from tests.factories import DesktopFactory, MembershipFactory, api_key_for

ROLES = [Role.OWNER, Role.ADMIN, Role.MEMBER, Role.VIEWER, "outsider"]


@dataclass(frozen=True)
class Case:
    name: str
    minimum: Role
    ok: int
    request: Callable  # (workspace, members) -> (method, url, body)


def _desktop(ws, m, state="running"):
    return DesktopFactory(workspace=ws, state=state).id


def _llm_key(ws, m):
    client = client_for(m[Role.OWNER])
    body = {"workspaceId": ws.id, "provider": "openai", "name": "k", "secret": "sk-test-12345678"}
    return client.post("/api/llm-keys", body, format="json").json()["id"]


def _api_key(ws, m):
    body = {"workspaceId": ws.id, "name": "ci"}
    return client_for(m[Role.OWNER]).post("/api/keys", body, format="json").json()["id"]


def _model_price(ws, m):
    body = {"model": "gpt-5", "inputPerMillion": "1.25", "outputPerMillion": "10"}
    return (
        client_for(m[Role.OWNER])
        .post(f"/api/workspaces/{ws.id}/model-prices", body, format="json")
        .json()["id"]
    )


CASES = [
    Case("list desktops", Role.VIEWER, 200, lambda ws, m: ("get", f"/api/desktops?workspace={ws.id}", None)),
    Case("get desktop", Role.VIEWER, 200, lambda ws, m: ("get", f"/api/desktops/{_desktop(ws, m)}", None)),
    Case(
        "desktop events",
        Role.VIEWER,
        200,
        lambda ws, m: ("get", f"/api/desktops/{_desktop(ws, m)}/events", None),
    ),
    Case(
        "create desktop",
        Role.MEMBER,
        201,
        lambda ws, m: ("post", "/api/desktops", {"name": "new-one", "workspaceId": ws.id}),
    ),
    Case(
        "stop desktop",
        Role.MEMBER,
        202,
        lambda ws, m: ("post", f"/api/desktops/{_desktop(ws, m)}/stop", None),
    ),
    Case(
        "start desktop",
        Role.MEMBER,
        202,
        lambda ws, m: ("post", f"/api/desktops/{_desktop(ws, m, 'stopped')}/start", None),
    ),
    Case(
        "suspend desktop",
        Role.MEMBER,
        202,
        lambda ws, m: ("post", f"/api/desktops/{_desktop(ws, m)}/suspend", None),
    ),
    Case(
        "resume desktop",
        Role.MEMBER,
        202,
        lambda ws, m: ("post", f"/api/desktops/{_desktop(ws, m, 'suspended')}/resume", None),
    ),
    Case(
        "destroy desktop",
        Role.MEMBER,
        202,
        lambda ws, m: ("delete", f"/api/desktops/{_desktop(ws, m)}", None),
    ),
    Case(
        "send chat",
        Role.MEMBER,
        202,
        lambda ws, m: ("post", f"/api/desktops/{_desktop(ws, m)}/chat", {"message": "Lance les tests"}),
    ),
    Case("read chat", Role.VIEWER, 200, lambda ws, m: ("get", f"/api/desktops/{_desktop(ws, m)}/chat", None)),
    Case(
        "desktop agent usage",
        Role.VIEWER,
        200,
        lambda ws, m: ("get", f"/api/desktops/{_desktop(ws, m)}/usage", None),
    ),
    Case(
        "workspace agent usage",
        Role.VIEWER,
        200,
        lambda ws, m: ("get", f"/api/workspaces/{ws.id}/usage", None),
    ),
    Case("get workspace", Role.VIEWER, 200, lambda ws, m: ("get", f"/api/workspaces/{ws.id}", None)),
    Case(
        "rename workspace",
        Role.ADMIN,
        200,
        lambda ws, m: ("patch", f"/api/workspaces/{ws.id}", {"name": "New"}),
    ),
    Case(
        "set agent command",
        Role.ADMIN,
        200,
        lambda ws, m: ("patch", f"/api/workspaces/{ws.id}", {"agentCommand": "my-agent --ask {message}"}),
    ),
    Case("delete workspace", Role.OWNER, 204, lambda ws, m: ("delete", f"/api/workspaces/{ws.id}", None)),
    Case("list members", Role.VIEWER, 200, lambda ws, m: ("get", f"/api/workspaces/{ws.id}/members", None)),
    Case(
        "invite someone",
        Role.ADMIN,
        201,
        lambda ws, m: (
            "post",
            f"/api/workspaces/{ws.id}/invitations",
            {"email": MembershipFactory().user.email},
        ),
    ),
    Case(
        "list invitations",
        Role.ADMIN,
        200,
        lambda ws, m: ("get", f"/api/workspaces/{ws.id}/invitations", None),
    ),
    Case(
        "withdraw an invitation",
        Role.ADMIN,
        204,
        lambda ws, m: ("delete", f"/api/workspaces/{ws.id}/invitations/{_invitation(ws, m)}", None),
    ),
    Case(
        "set who may take control",
        Role.ADMIN,
        200,
        lambda ws, m: ("patch", f"/api/workspaces/{ws.id}", {"controlRole": "admin"}),
    ),
    Case(
        "change role",
        Role.ADMIN,
        200,
        lambda ws, m: ("patch", f"/api/workspaces/{ws.id}/members/{m[Role.VIEWER].id}", {"role": "member"}),
    ),
    Case(
        "remove member",
        Role.ADMIN,
        204,
        lambda ws, m: (
            "delete",
            f"/api/workspaces/{ws.id}/members/{MembershipFactory(workspace=ws).id}",
            None,
        ),
    ),
    Case("list api keys", Role.ADMIN, 200, lambda ws, m: ("get", f"/api/keys?workspace={ws.id}", None)),
    Case(
        "create api key",
        Role.ADMIN,
        201,
        lambda ws, m: ("post", "/api/keys", {"workspaceId": ws.id, "name": "x"}),
    ),
    Case("revoke api key", Role.ADMIN, 204, lambda ws, m: ("delete", f"/api/keys/{_api_key(ws, m)}", None)),
    Case("list llm keys", Role.ADMIN, 200, lambda ws, m: ("get", f"/api/llm-keys?workspace={ws.id}", None)),
    Case(
        "add llm key",
        Role.ADMIN,
        201,
        lambda ws, m: (
            "post",
            "/api/llm-keys",
            {"workspaceId": ws.id, "provider": "anthropic", "name": "a", "secret": "sk-ant-1234567890"},
        ),
    ),
    Case(
        "rotate llm key",
        Role.ADMIN,
        200,
        lambda ws, m: (
            "put",
            f"/api/llm-keys/{_llm_key(ws, m)}",
            {"provider": "openai", "name": "k", "secret": "sk-rotated-87654321"},
        ),
    ),
    Case(
        "delete llm key", Role.ADMIN, 204, lambda ws, m: ("delete", f"/api/llm-keys/{_llm_key(ws, m)}", None)
    ),
    Case("read audit", Role.ADMIN, 200, lambda ws, m: ("get", f"/api/audit?workspace={ws.id}", None)),
    Case(
        "workspace costs",
        Role.VIEWER,
        200,
        lambda ws, m: ("get", f"/api/workspaces/{ws.id}/costs?month=2026-12", None),
    ),
    Case(
        "desktop costs",
        Role.VIEWER,
        200,
        lambda ws, m: ("get", f"/api/desktops/{_desktop(ws, m)}/costs", None),
    ),
    Case("workspace quota", Role.VIEWER, 200, lambda ws, m: ("get", f"/api/workspaces/{ws.id}/quota", None)),
    Case(
        "list model prices",
        Role.VIEWER,
        200,
        lambda ws, m: ("get", f"/api/workspaces/{ws.id}/model-prices", None),
    ),
    Case(
        "set model price",
        Role.ADMIN,
        200,
        lambda ws, m: (
            "post",
            f"/api/workspaces/{ws.id}/model-prices",
            {"model": "claude-sonnet-4-5", "inputPerMillion": "3", "outputPerMillion": "15"},
        ),
    ),
    Case(
        "delete model price",
        Role.ADMIN,
        204,
        lambda ws, m: ("delete", f"/api/workspaces/{ws.id}/model-prices/{_model_price(ws, m)}", None),
    ),
]


def _schedule(ws, m):
    body = {"cron": "0 9 * * 1-5", "message": "Rapport du jour", "timezone": "Europe/Paris"}
    url = f"/api/desktops/{_desktop(ws, m)}/schedules"
    return client_for(m[Role.OWNER]).post(url, body, format="json").json()["id"]


def _chat_reply(ws, m):
    desktop = _desktop(ws, m)
    url = f"/api/desktops/{desktop}/chat"
    reply = client_for(m[Role.OWNER]).post(url, {"message": "Bonjour"}, format="json").json()["id"]
    return f"/api/desktops/{desktop}/chat/{reply}"


FLEET_CASES = [
    Case(
        "list desktops by label",
        Role.VIEWER,
        200,
        lambda ws, m: ("get", f"/api/desktops?workspace={ws.id}&label=ci", None),
    ),
    Case(
        "workspace labels", Role.VIEWER, 200, lambda ws, m: ("get", f"/api/workspaces/{ws.id}/labels", None)
    ),
    Case(
        "label a desktop",
        Role.MEMBER,
        200,
        lambda ws, m: ("post", f"/api/desktops/{_desktop(ws, m)}/labels", {"add": ["ci"]}),
    ),
    Case(
        "bulk create",
        Role.MEMBER,
        201,
        lambda ws, m: ("post", "/api/desktops/bulk", {"workspaceId": ws.id, "namePrefix": "ci", "count": 2}),
    ),
    Case(
        "bulk stop",
        Role.MEMBER,
        200,
        lambda ws, m: ("post", "/api/desktops/bulk/stop", {"workspaceId": ws.id, "ids": [_desktop(ws, m)]}),
    ),
    Case(
        "bulk label",
        Role.MEMBER,
        200,
        lambda ws, m: (
            "post",
            "/api/desktops/bulk/labels",
            {"workspaceId": ws.id, "all": True, "add": ["x"]},
        ),
    ),
    # Access is granted before the desktop's state is looked at: a stopped desktop answers 409 to whoever
    # may run commands in it (and no shell is dialled).
    Case(
        "run a command",
        Role.MEMBER,
        409,
        lambda ws, m: ("post", f"/api/desktops/{_desktop(ws, m, 'stopped')}/exec", {"command": "id"}),
    ),
    # The screen likewise: access, then the desktop's state (tests/api/test_screen.py drives a real one).
    Case(
        "take a screenshot",
        Role.VIEWER,
        409,
        lambda ws, m: ("get", f"/api/desktops/{_desktop(ws, m, 'stopped')}/screenshot", None),
    ),
    Case(
        "read the screen's size",
        Role.VIEWER,
        409,
        lambda ws, m: ("get", f"/api/desktops/{_desktop(ws, m, 'stopped')}/screen", None),
    ),
    Case(
        "act on the screen",
        Role.MEMBER,
        409,
        lambda ws, m: (
            "post",
            f"/api/desktops/{_desktop(ws, m, 'stopped')}/actions",
            {"actions": [{"type": "click", "x": 1, "y": 1}]},
        ),
    ),
    Case("read a chat message", Role.VIEWER, 200, lambda ws, m: ("get", _chat_reply(ws, m), None)),
    Case(
        "list schedules",
        Role.VIEWER,
        200,
        lambda ws, m: ("get", f"/api/desktops/{_desktop(ws, m)}/schedules", None),
    ),
    Case(
        "create schedule",
        Role.MEMBER,
        201,
        lambda ws, m: (
            "post",
            f"/api/desktops/{_desktop(ws, m)}/schedules",
            {"cron": "*/30 * * * *", "message": "Surveille le pipeline"},
        ),
    ),
    Case("get schedule", Role.VIEWER, 200, lambda ws, m: ("get", f"/api/schedules/{_schedule(ws, m)}", None)),
    Case(
        "schedule runs",
        Role.VIEWER,
        200,
        lambda ws, m: ("get", f"/api/schedules/{_schedule(ws, m)}/runs", None),
    ),
    Case(
        "change schedule",
        Role.MEMBER,
        200,
        lambda ws, m: ("patch", f"/api/schedules/{_schedule(ws, m)}", {"enabled": False}),
    ),
    Case(
        "delete schedule",
        Role.MEMBER,
        204,
        lambda ws, m: ("delete", f"/api/schedules/{_schedule(ws, m)}", None),
    ),
]
CASES += FLEET_CASES

EGRESS = {"mode": "allowlist", "entries": ["pypi.org", "*.github.com", "203.0.113.0/24"]}
CASES += [
    Case(
        "read workspace egress",
        Role.VIEWER,
        200,
        lambda ws, m: ("get", f"/api/workspaces/{ws.id}/egress", None),
    ),
    Case(
        "set workspace egress",
        Role.ADMIN,
        200,
        lambda ws, m: ("put", f"/api/workspaces/{ws.id}/egress", EGRESS),
    ),
    Case(
        "read desktop egress",
        Role.VIEWER,
        200,
        lambda ws, m: ("get", f"/api/desktops/{_desktop(ws, m)}/egress", None),
    ),
    Case(
        "set desktop egress",
        Role.ADMIN,
        200,
        lambda ws, m: ("put", f"/api/desktops/{_desktop(ws, m)}/egress", {"mode": "deny"}),
    ),
    Case(
        "desktop follows its workspace's egress",
        Role.ADMIN,
        200,
        lambda ws, m: ("delete", f"/api/desktops/{_desktop(ws, m)}/egress", None),
    ),
]


def _approval(ws, m):
    return approvals.approval_request(
        desktop=DesktopFactory(workspace=ws, state="running"), title="Déployer"
    ).id


LOOP_CASES = [
    Case(
        "cancel a turn",
        Role.MEMBER,
        200,
        lambda ws, m: ("post", f"{_chat_reply(ws, m)}/cancel", None),
    ),
    Case(
        "list approvals", Role.VIEWER, 200, lambda ws, m: ("get", f"/api/approvals?workspace={ws.id}", None)
    ),
    Case("get approval", Role.VIEWER, 200, lambda ws, m: ("get", f"/api/approvals/{_approval(ws, m)}", None)),
    Case(
        "approve",
        Role.MEMBER,
        200,
        lambda ws, m: ("post", f"/api/approvals/{_approval(ws, m)}/approve", {"comment": "Oui"}),
    ),
    Case("deny", Role.MEMBER, 200, lambda ws, m: ("post", f"/api/approvals/{_approval(ws, m)}/deny", {})),
    Case(
        "set the approval policy",
        Role.ADMIN,
        200,
        lambda ws, m: (
            "patch",
            f"/api/workspaces/{ws.id}",
            {"approvalRole": "admin", "approvalTimeout": 600, "approvalCommands": ["git push"]},
        ),
    ),
    Case(
        "read the webhook", Role.ADMIN, 200, lambda ws, m: ("get", f"/api/workspaces/{ws.id}/webhook", None)
    ),
    Case(
        "set the webhook",
        Role.ADMIN,
        200,
        lambda ws, m: ("put", f"/api/workspaces/{ws.id}/webhook", {"url": "", "rotateSecret": True}),
    ),
    Case(
        "webhook deliveries",
        Role.ADMIN,
        200,
        lambda ws, m: ("get", f"/api/workspaces/{ws.id}/webhook/deliveries", None),
    ),
]
CASES += LOOP_CASES


def _alert(ws, m):
    desktop = DesktopFactory(workspace=ws, state="error")
    alerts.alerts_evaluate()
    return desktop.alerts.get().id


ALERT_CASES = [
    Case("list alerts", Role.VIEWER, 200, lambda ws, m: ("get", f"/api/alerts?workspace={ws.id}", None)),
    Case("get alert", Role.VIEWER, 200, lambda ws, m: ("get", f"/api/alerts/{_alert(ws, m)}", None)),
    Case(
        "acknowledge an alert",
        Role.MEMBER,
        200,
        lambda ws, m: ("post", f"/api/alerts/{_alert(ws, m)}/acknowledge", None),
    ),
    Case(
        "set the alert thresholds",
        Role.ADMIN,
        200,
        lambda ws, m: ("patch", f"/api/workspaces/{ws.id}", {"alertThresholds": {"cpuPercent": 80}}),
    ),
    Case(
        "blocked egress attempts",
        Role.VIEWER,
        200,
        lambda ws, m: ("get", f"/api/desktops/{_desktop(ws, m)}/blocked", None),
    ),
]
CASES += ALERT_CASES


def _invitation(workspace, members) -> str:
    return Invitation.objects.create(workspace=workspace, email="someone@example.com", role=Role.MEMBER).id


def expected(case: Case, role) -> int:
    if role == "outsider":
        return 404
    return case.ok if Role(role).rank >= case.minimum.rank else 403


@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_access(case, role, workspace, members, plan):
    method, url, body = case.request(workspace, members)
    client = client_for(key=api_key_for(members[role]))
    response = getattr(client, method)(url, body, format="json")
    assert response.status_code == expected(case, role), response.content
    if response.status_code >= 400:
        error = response.json()["error"]
        assert error["code"] and error["message"]


@pytest.mark.parametrize("role", ROLES)
def test_plans_are_readable_by_anyone_signed_in(role, members, plan):
    response = client_for(key=api_key_for(members[role])).get("/api/plans")
    assert response.status_code == 200
    assert "starter" in [p["name"] for p in response.json()["results"]]


@pytest.mark.parametrize("role", ROLES)
def test_tiers_are_readable_by_anyone_signed_in(role, members):
    response = client_for(key=api_key_for(members[role])).get("/api/tiers")
    assert response.status_code == 200
    assert "free" in [t["name"] for t in response.json()["results"]]


def test_outsider_sees_no_desktop_of_another_workspace_in_lists(workspace, members):
    DesktopFactory(workspace=workspace)
    response = client_for(key=api_key_for(members["outsider"])).get("/api/desktops")
    assert response.json()["count"] == 0
