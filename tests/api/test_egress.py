"""Egress policies through the API: the preset, who may change them, what is refused, what is enforced."""

import pytest

from desktops import services
from desktops.egress import PRESET_ENTRIES, egress_of_desktop, egress_of_workspace
from desktops.models import AuditEvent, EgressMode, Role
from tests.conftest import client_for
from tests.factories import DesktopFactory, api_key_for
from workers.drivers.base import NetworkPolicy


def test_a_new_workspace_starts_on_the_allow_list_preset_with_its_keys_providers(user):
    workspace = services.workspace_create(user=user, name="Agents")
    client = client_for()
    client.force_login(user)
    body = client.get(f"/api/workspaces/{workspace.id}/egress").json()
    assert body["mode"] == "allowlist"
    assert body["entries"] == list(PRESET_ENTRIES)
    assert {"pypi.org", "registry.npmjs.org", "crates.io", "deb.debian.org", "github.com"} <= set(
        body["entries"]
    )
    assert body["allowLlmProviders"] is True and body["llmHosts"] == []

    for provider, extra in [
        ("anthropic", {}),
        ("openai_compatible", {"baseUrl": "https://llm.internal.example:8443/v1", "model": "m"}),
    ]:
        key = {
            "workspaceId": workspace.id,
            "provider": provider,
            "name": provider,
            "secret": "sk-test-12345678",
        }
        assert client.post("/api/llm-keys", {**key, **extra}, format="json").status_code == 201
    body = client.get(f"/api/workspaces/{workspace.id}/egress").json()
    assert body["llmHosts"] == ["api.anthropic.com", "llm.internal.example"]

    # A key's server named by address is a network of one; a name no policy can allow is left out.
    for name, url in [("by-address", "http://203.0.113.9:8000/v1"), ("local", "http://localhost:8000/v1")]:
        key = {
            "workspaceId": workspace.id,
            "provider": "openai_compatible",
            "name": name,
            "secret": "sk-test-12345678",
        }
        assert (
            client.post("/api/llm-keys", {**key, "baseUrl": url, "model": "m"}, format="json").status_code
            == 201
        )
    assert egress_of_workspace(workspace=workspace).llm_hosts == (
        "203.0.113.9",
        "api.anthropic.com",
        "llm.internal.example",
    )
    policy = egress_of_workspace(workspace=workspace).network_policy()
    assert policy.allowed_cidrs == ("203.0.113.9/32",)
    assert set(policy.allowed_domains) == {*PRESET_ENTRIES, "api.anthropic.com", "llm.internal.example"}


def test_the_policy_a_desktop_gets_from_its_workspace_and_its_own(members, workspace):
    desktop = DesktopFactory(workspace=workspace)
    client = client_for(key=api_key_for(members[Role.ADMIN]))
    put = {"mode": "allowlist", "entries": ["PyPI.org.", "*.github.com", "203.0.113.7", "pypi.org"]}
    body = client.put(f"/api/workspaces/{workspace.id}/egress", put, format="json").json()
    # Normalised: lowercase names without the final dot, networks with their prefix, no repeats.
    assert body["entries"] == ["pypi.org", "*.github.com", "203.0.113.7/32"]
    assert body["updatedBy"] == members[Role.ADMIN].user.email

    mine = client.get(f"/api/desktops/{desktop.id}/egress").json()
    assert mine["inherited"] is True and mine["entries"] == body["entries"]
    assert egress_of_desktop(desktop=desktop).network_policy() == NetworkPolicy(
        allow_internet=False, allowed_cidrs=("203.0.113.7/32",), allowed_domains=("pypi.org", "*.github.com")
    )

    own = client.put(f"/api/desktops/{desktop.id}/egress", {"mode": "open"}, format="json").json()
    assert own["inherited"] is False and own["mode"] == "open"
    assert egress_of_desktop(desktop=desktop).network_policy() == NetworkPolicy()
    # The workspace's policy changes; the desktop with its own keeps it.
    client.put(f"/api/workspaces/{workspace.id}/egress", {"mode": "deny"}, format="json")
    assert client.get(f"/api/desktops/{desktop.id}/egress").json()["mode"] == "open"

    back = client.delete(f"/api/desktops/{desktop.id}/egress").json()
    assert back["inherited"] is True and back["mode"] == "deny"
    assert egress_of_desktop(desktop=desktop).network_policy() == NetworkPolicy(allow_internet=False)

    actions = list(AuditEvent.objects.filter(workspace_id=workspace.id).values_list("action", "target"))
    assert ("workspace.egress", workspace.id) in actions
    assert ("desktop.egress", desktop.id) in actions
    assert ("desktop.egress_inherit", desktop.id) in actions
    going_open = AuditEvent.objects.get(action="desktop.egress")
    assert going_open.detail["mode"] == EgressMode.OPEN
    assert going_open.actor.startswith("key:")


@pytest.mark.parametrize(
    "entries",
    [
        ["pypi.org", "not a domain"],
        ["10.0.0.0/33"],
        ["*.*.example.com"],
        ["exa_mple.com"],
        ["2001:db8::/32"],
        ["localhost"],
        ["x" * 64 + ".com"],
    ],
)
def test_a_bad_entry_is_refused_by_name_and_nothing_is_lost(members, workspace, entries):
    client = client_for(key=api_key_for(members[Role.OWNER]))
    url = f"/api/workspaces/{workspace.id}/egress"
    client.put(url, {"mode": "allowlist", "entries": ["pypi.org"]}, format="json")
    response = client.put(url, {"mode": "open", "entries": entries}, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert repr(entries[-1]) in error["message"]
    assert "entries" in error["fields"]
    kept = client.get(url).json()
    assert (kept["mode"], kept["entries"]) == ("allowlist", ["pypi.org"])


def test_an_unknown_mode_and_too_many_entries_are_refused(members, workspace):
    client = client_for(key=api_key_for(members[Role.OWNER]))
    url = f"/api/workspaces/{workspace.id}/egress"
    assert client.put(url, {"mode": "sometimes"}, format="json").status_code == 400
    many = [f"host{i}.example.com" for i in range(201)]
    assert client.put(url, {"mode": "allowlist", "entries": many}, format="json").status_code == 400


def test_members_and_read_keys_cannot_open_the_internet(members, workspace):
    desktop = DesktopFactory(workspace=workspace)
    owner = members[Role.OWNER]
    client_for(key=api_key_for(owner)).put(
        f"/api/workspaces/{workspace.id}/egress", {"mode": "deny"}, format="json"
    )
    attempts = [
        client_for(key=api_key_for(members[Role.MEMBER])),
        client_for(key=api_key_for(owner, scope="read")),
    ]
    for client in attempts:
        assert (
            client.put(f"/api/workspaces/{workspace.id}/egress", {"mode": "open"}, format="json").status_code
            == 403
        )
        assert (
            client.put(f"/api/desktops/{desktop.id}/egress", {"mode": "open"}, format="json").status_code
            == 403
        )
        assert client.delete(f"/api/desktops/{desktop.id}/egress").status_code == 403
    assert egress_of_desktop(desktop=desktop).network_policy() == NetworkPolicy(allow_internet=False)


def test_an_outsider_can_neither_read_nor_change_another_workspaces_policy(members, workspace):
    desktop = DesktopFactory(workspace=workspace)
    outsider = client_for(key=api_key_for(members["outsider"]))
    # An owner of another workspace, with a session rather than a key, is an outsider here too.
    session = client_for(members["outsider"])
    for client in (outsider, session):
        for url in (f"/api/workspaces/{workspace.id}/egress", f"/api/desktops/{desktop.id}/egress"):
            assert client.get(url).status_code == 404
            assert client.put(url, {"mode": "open"}, format="json").status_code == 404
    assert not AuditEvent.objects.filter(action__contains="egress").exists()
