"""The pages' markup holds up for everyone: ids are unique, and every field a person fills in is named
(by a <label>, or aria-label where a page shows it bare)."""

from collections import Counter
from html.parser import HTMLParser

import pytest

from desktops.models import Role
from tests.factories import DesktopFactory, api_key_for, audit_event


class Fields(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids, self.labelled_for, self.unnamed, self.open_labels = Counter(), set(), [], 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and not hasattr(self, "first_link"):
            self.first_link = attrs
        if "id" in attrs:
            self.ids[attrs["id"]] += 1
        if tag == "label":
            self.open_labels += 1
            self.labelled_for.add(attrs.get("for"))
        if tag in ("input", "select", "textarea") and attrs.get("type") not in ("hidden", "submit"):
            named = self.open_labels or attrs.get("aria-label") or attrs.get("aria-labelledby")
            if not named:
                self.unnamed.append(attrs)

    def handle_endtag(self, tag):
        if tag == "label":
            self.open_labels -= 1


@pytest.mark.parametrize("page", ["desktops", "settings", "viewer", "costs", "audit", "destroyed"])
def test_ids_are_unique_and_every_field_is_named(client, members, workspace, plan, page):
    owner = members[Role.OWNER]
    desktop = DesktopFactory(workspace=workspace, state="destroyed" if page == "destroyed" else "running")
    api_key_for(owner)
    client.force_login(owner.user)
    url = f"/desktops/{desktop.id}/" if page in ("viewer", "destroyed") else f"/w/{workspace.id}/{page}/"
    html = Fields()
    html.feed(client.get(url).content.decode())
    assert [i for i, n in html.ids.items() if n > 1] == []
    unnamed = [f for f in html.unnamed if f.get("id") not in html.labelled_for]
    assert unnamed == []
    # The Tab key's first stop skips the header, to an element of the page.
    assert html.first_link["class"] == "skip-link" and html.first_link["href"][1:] in html.ids


def test_nobody_changes_or_removes_their_own_membership_by_a_slip(client, members, workspace):
    owner = members[Role.OWNER]
    client.force_login(owner.user)
    page = client.get(f"/w/{workspace.id}/settings/").content.decode()
    assert f"/members/{owner.id}/role/" not in page and f"/members/{owner.id}/remove/" not in page
    admin = members[Role.ADMIN]
    assert f"/members/{admin.id}/role/" in page and f"/members/{admin.id}/remove/" in page


def test_a_signed_out_visitor_lands_on_what_it_is_and_the_way_in(client, db):
    page = client.get("/").content.decode()
    assert "Real desktops for your AI agents" in page and "free during the beta" in page
    assert 'href="/accounts/signup/"' in page and 'href="/pricing/"' in page
    french = client.get("/", HTTP_ACCEPT_LANGUAGE="fr").content.decode()
    assert "Inscrivez-vous" in french


def test_a_refused_settings_form_comes_back_as_it_was_filled_in(client, members, workspace):
    client.force_login(members[Role.ADMIN].user)
    response = client.post(
        f"/w/{workspace.id}/llm-keys/new/",
        {
            "provider": "openai_compatible",
            "name": "my-model",
            "secret": "sk-long-enough-1234",
            "model": "m-7",
        },
    )
    page = response.content.decode()
    assert response.status_code == 400 and "needs its baseUrl" in page
    assert 'value="my-model"' in page and 'value="m-7"' in page
    assert "sk-long-enough-1234" not in page  # a secret is never sent back
    assert not workspace.llm_keys.exists()
    invalid = client.post(f"/w/{workspace.id}/members/invite/", {"email": "not-an-address", "role": "member"})
    assert invalid.status_code == 400 and 'value="not-an-address"' in invalid.content.decode()


def test_the_audit_log_names_desktops_and_finds_them_by_name(client, members, workspace):
    desktop = DesktopFactory(workspace=workspace, name="compta-agent")
    elsewhere = DesktopFactory(name="compta-agent")  # same name, another workspace: never mixed in
    for target in (desktop.id, elsewhere.id):
        audit_event(email="a@example.com", action="desktop.stop", workspace_id=workspace.id, target=target)
    audit_event(email="b@example.com", action="desktop.start", workspace_id=workspace.id, target="dsk_x")
    client.force_login(members[Role.ADMIN].user)
    page = client.get(f"/w/{workspace.id}/audit/?target=compta-agent").content.decode()
    assert f'<span title="{desktop.id}">compta-agent</span>' in page  # the name, its id on hover
    assert "b@example.com" not in page and page.count(">a@example.com</span>") == 1  # one stop, no start
    assert f"<code>{elsewhere.id}</code>" not in page
