"""The audit log as people read it: their acts (not the pages' own comings and goings), each target by
its name with its id on hover, found by name, within the workspace only, the chain intact."""

import ast
import re
from pathlib import Path

import pytest

from desktops import schedules, services
from desktops.audit import SYSTEM, Actor, audit_chain_verify, audit_record
from desktops.models import AuditEvent, DesktopState, LLMProvider, Role
from missioncontrol.audit_actions import ACTIONS
from tests.factories import DesktopFactory, MembershipFactory
from tests.support.relays import mint


def audit_page(client, membership, query=""):
    client.force_login(membership.user)
    response = client.get(f"/w/{membership.workspace_id}/audit/{query}")
    assert response.status_code == 200
    return response.content.decode()


def table(page):
    """The log's rows alone (the filter's form says back what was typed)."""
    return page[page.index("<table>") : page.index("</table>")]


def named(page, target_id):
    """What the row shows for that target: its name, the id on hover."""
    found = re.search(rf'<span title="{re.escape(target_id)}">([^<]*)</span>', page)
    return found and found.group(1)


@pytest.fixture
def running(workspace, plan):
    return DesktopFactory(workspace=workspace, state=DesktopState.RUNNING, name="compta-agent")


def test_watching_and_reconnecting_are_not_recorded_taking_control_is(members, running):
    member, viewer = members[Role.MEMBER], members[Role.VIEWER]
    for _ in range(3):  # a page opening, then reconnecting by itself
        mint(viewer, running, "view", session="viewer-session")
        mint(member, running, "view", session="member-session")
    assert not AuditEvent.objects.filter(target=running.id).exists()

    mint(member, running, "control", session="member-session")
    mint(member, running, "control", session="member-session")  # a reconnection: still in control
    taken = AuditEvent.objects.filter(target=running.id, action="desktop.control_taken")
    assert list(taken.values_list("actor", flat=True)) == [f"user:{member.user.email}"]

    # Back to watching, then control again: a second act. Another session of theirs is another act too.
    mint(member, running, "view", session="member-session")
    mint(member, running, "control", session="member-session")
    mint(member, running, "control", session="another-browser")
    assert taken.count() == 3
    assert audit_chain_verify().broken is None


def test_targets_show_by_name_with_their_id_on_hover(client, members, workspace, running):
    owner, admin = members[Role.OWNER], members[Role.ADMIN]
    actor = Actor(user=owner.user)
    leaving = MembershipFactory(workspace=workspace, role=Role.VIEWER)
    services.membership_set_role(
        actor=actor, workspace_id=workspace.id, membership_id=leaving.id, role="member"
    )
    key, _token = services.api_key_create(
        actor=actor, workspace_id=workspace.id, name="ci-runner", scope="read"
    )
    llm = services.llm_key_save(
        actor=actor,
        workspace_id=workspace.id,
        provider=LLMProvider.ANTHROPIC,
        name="claude-prod",
        secret="sk-12345678",
    )
    schedule = schedules.schedule_create(
        actor=actor, desktop=running, cron="0 9 * * 1-5", tz="Europe/Paris", message="Rapport"
    )
    services.workspace_rename(actor=actor, workspace_id=workspace.id, name="Compta")
    page = audit_page(client, admin)
    assert named(page, running.id) is None  # no act on the desktop itself yet
    assert named(page, leaving.id) == leaving.user.email
    assert named(page, key.id) == "ci-runner"
    assert named(page, llm.id) == "claude-prod"
    assert named(page, schedule.id) == "compta-agent · 0 9 * * 1-5"
    assert named(page, workspace.id) == "Compta"

    # Gone since, they keep the name their last event recorded.
    services.membership_remove(actor=actor, workspace_id=workspace.id, membership_id=leaving.id)
    services.llm_key_delete(actor=actor, workspace_id=workspace.id, key_id=llm.id)
    page = audit_page(client, admin)
    assert named(page, leaving.id) == leaving.user.email and named(page, llm.id) == "claude-prod"
    assert audit_chain_verify().broken is None


def test_the_target_filter_finds_by_name_address_or_id_within_the_workspace(
    client, members, workspace, running
):
    owner, admin = members[Role.OWNER], members[Role.ADMIN]
    outsider = members["outsider"]
    # Another workspace's desktop of the same name, and its own events: never reached from here.
    theirs = DesktopFactory(workspace=outsider.workspace, name="compta-agent", state=DesktopState.RUNNING)
    mint(outsider, theirs, "control", session="outsider")
    mint(owner, running, "control", session="owner")
    leaving = MembershipFactory(workspace=workspace, role=Role.VIEWER)
    services.membership_remove(
        actor=Actor(user=owner.user), workspace_id=workspace.id, membership_id=leaving.id
    )

    page = audit_page(client, admin, "?target=COMPTA")  # part of the name, any case
    assert named(page, running.id) == "compta-agent" and "1 event<" in page
    assert theirs.id not in page and outsider.user.email not in page and "member.remove" not in table(page)

    page = audit_page(client, admin, f"?target={leaving.user.email.split('@')[0]}")
    assert "member.remove" in table(page) and "desktop.control_taken" not in table(page)

    # The other workspace's desktop, by its id or its owner's address: nothing, and the page says so.
    for attempt in (theirs.id, outsider.user.email):
        page = audit_page(client, admin, f"?target={attempt}")
        assert theirs.id not in table(page) and "desktop.control_taken" not in table(page)
        assert "No event matches these filters." in page and "0 events" in page
    csv = client.get(f"/w/{workspace.id}/audit/?target={theirs.id}&format=csv")
    assert b"".join(csv.streaming_content).decode().splitlines()[1:] == []
    # Nor does the outsider's own log show this workspace's events by this desktop's name.
    page = audit_page(client, outsider, "?target=compta-agent")
    assert named(page, theirs.id) == "compta-agent" and running.id not in table(page)


def test_only_admins_read_the_log(client, members, workspace):
    for role, expected in ((Role.MEMBER, 403), (Role.VIEWER, 403), ("outsider", 404)):
        client.force_login(members[role].user)
        assert client.get(f"/w/{workspace.id}/audit/?target=x").status_code == expected


def test_an_act_through_an_api_key_names_the_person_and_the_key(client, members, workspace, running):
    owner = members[Role.OWNER]
    key, _token = services.api_key_create(
        actor=Actor(user=owner.user), workspace_id=workspace.id, name="nightly-ci", scope="write"
    )
    services.chat_send(actor=Actor(user=owner.user, api_key=key), desktop=running, message="Rapport")
    page = audit_page(client, members[Role.ADMIN], "?action=chat.")
    assert (
        f'<span title="key:{key.id} ({owner.user.email})">{owner.user.email} with the key nightly-ci</span>'
        in page
    )


def test_every_action_the_platform_records_reads_as_words():
    """Each action an audit_record call names, each desktop state a transition records and each answer
    to an approval has its words on the page (a new action without them shows its bare code)."""
    recorded = set()
    for path in [*Path("desktops").rglob("*.py"), *Path("billing").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "audit_record":
                action = next((k.value for k in node.keywords if k.arg == "action"), None)
                if isinstance(action, ast.Constant):
                    recorded.add(action.value)
    recorded |= {f"desktop.{state}" for state in DesktopState.values}
    recorded |= {f"approval.{status}" for status in ("approved", "denied", "expired")}
    recorded |= {"workspace.egress", "desktop.egress"}  # through egress's one place that stores a policy
    assert len(recorded) > 50 and recorded - set(ACTIONS) == set()


def test_actors_read_as_people_and_the_platform_not_as_labels(client, members, workspace, running):
    """The audit page showed its actors as raw labels (user:alice@…, system:worker)."""
    owner = members[Role.OWNER]
    services.workspace_rename(actor=Actor(user=owner.user), workspace_id=workspace.id, name="Compta")
    audit_record(actor=SYSTEM, action="desktop.running", workspace_id=workspace.id, target=running.id)
    page = audit_page(client, members[Role.ADMIN])
    assert f'<span title="user:{owner.user.email}">{owner.user.email}</span>' in page
    assert '<span title="system:worker">Le Bureau (worker)</span>' in page
