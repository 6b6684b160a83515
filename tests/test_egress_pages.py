"""Egress policies in Mission Control: the settings section, a desktop's Network tab, who may change them."""

import re

from django.test import Client

from desktops import services
from desktops.egress import egress_of_desktop, egress_of_workspace
from desktops.models import AuditEvent, EgressMode, Role
from tests.factories import DesktopFactory


def browser(membership) -> Client:
    client = Client()
    client.force_login(membership.user)
    return client


def test_a_new_workspaces_preset_shows_in_its_settings_and_admins_change_it(user):
    workspace = services.workspace_create(user=user, name="Agents")
    client = Client()
    client.force_login(user)
    page = client.get(f"/w/{workspace.id}/settings/").content.decode()
    assert 'id="egress"' in page and "pypi.org" in page and "registry.npmjs.org" in page
    assert re.search(r'value="allowlist"[^>]*checked', page), "the allow-list is the chosen mode"

    form = {"mode": "open", "entries": "pypi.org\n\n  github.com  ", "allow_llm_providers": "on"}
    saved = client.post(f"/w/{workspace.id}/settings/egress/", form)
    assert saved.status_code == 302 and saved["Location"].endswith("#egress")
    policy = egress_of_workspace(workspace=workspace)
    assert (policy.mode, policy.entries) == (EgressMode.OPEN, ("pypi.org", "github.com"))
    assert AuditEvent.objects.filter(action="workspace.egress", detail__mode="open").exists()


def test_a_bad_entry_is_named_and_what_was_typed_comes_back(workspace, members):
    admin = browser(members[Role.ADMIN])
    form = {"mode": "allowlist", "entries": "allowed.test\nnot a domain!"}
    page = admin.post(f"/w/{workspace.id}/settings/egress/", form, follow=True).content.decode()
    assert "not a domain!" in page.split('id="egress-form"')[1]  # still in the form, to be fixed
    assert "&#x27;not a domain!&#x27;" in page.split('id="egress-form"')[0]  # and named in the message
    assert egress_of_workspace(workspace=workspace).mode == EgressMode.OPEN  # nothing changed


def test_members_and_outsiders_cannot_change_a_policy_from_the_pages(workspace, members):
    desktop = DesktopFactory(workspace=workspace)
    assert (
        browser(members["outsider"]).post(f"/w/{workspace.id}/settings/egress/", {"mode": "open"}).status_code
        == 404
    )
    assert (
        browser(members["outsider"]).post(f"/desktops/{desktop.id}/egress/", {"mode": "open"}).status_code
        == 404
    )
    for role in (Role.VIEWER, Role.MEMBER):
        browser(members[role]).post(f"/w/{workspace.id}/settings/egress/", {"mode": "deny"})
        browser(members[role]).post(f"/desktops/{desktop.id}/egress/", {"mode": "deny"})
        page = browser(members[role]).get(f"/desktops/{desktop.id}/").content.decode()
        assert 'id="egress-panel"' in page and 'id="egress-form"' not in page
    assert egress_of_desktop(desktop=desktop).mode == EgressMode.OPEN
    assert not AuditEvent.objects.filter(action__contains="egress").exists()


def test_a_desktops_network_tab_shows_its_policy_and_admins_set_its_own(workspace, members):
    desktop = DesktopFactory(workspace=workspace)
    admin = browser(members[Role.ADMIN])
    url = f"/desktops/{desktop.id}/egress/"
    saved = admin.post(url, {"mode": "allowlist", "entries": "allowed.test\n203.0.113.0/24"})
    assert saved["Location"].endswith("#egress-panel")
    page = browser(members[Role.VIEWER]).get(f"/desktops/{desktop.id}/").content.decode()
    tab = page.split('id="egress-panel"')[1]
    assert "allowed.test" in tab and "203.0.113.0/24" in tab and "(the workspace's policy)" not in tab

    admin.post(url, {"mode": "inherit"})
    policy = egress_of_desktop(desktop=desktop)
    assert policy.inherited and policy.mode == EgressMode.OPEN
    tab = (
        browser(members[Role.VIEWER])
        .get(f"/desktops/{desktop.id}/")
        .content.decode()
        .split('id="egress-panel"')[1]
    )
    assert "(the workspace's policy)" in tab
