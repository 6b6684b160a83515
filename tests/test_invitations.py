"""Joining a workspace takes the invitee's consent, from the invited address, confirmed.

The attack this stops: pre-register an account with a future hire's address, wait for the invitation
(as admin, say), and be added at once. Nobody is added without accepting, and only someone who has
confirmed the invited address can accept.
"""

import re
import threading
from datetime import timedelta
from urllib.parse import urlencode

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.core import mail, signing
from django.db import connection
from django.utils import timezone

from desktops import services
from desktops.audit import Actor
from desktops.errors import Conflict, Forbidden
from desktops.models import Invitation, Membership, Role
from tests.conftest import client_for
from tests.factories import PASSWORD, MembershipFactory, UserFactory, api_key_for

User = get_user_model()

pytestmark = pytest.mark.django_db

HIRE = "future.hire@example.com"


def invite(members, workspace, email=HIRE, role="admin"):
    response = client_for(members[Role.OWNER]).post(
        f"/api/workspaces/{workspace.id}/invitations", {"email": email, "role": role}, format="json"
    )
    assert response.status_code == 201, response.content
    return response.json()


def person(email: str, *, confirmed: bool):
    return UserFactory(email=email, confirmed=confirmed)


def test_a_pre_registered_unconfirmed_address_cannot_take_an_invitation(members, workspace):
    squatter = person(HIRE, confirmed=False)
    invitation = invite(members, workspace)
    assert not Membership.objects.filter(workspace=workspace, user=squatter).exists(), "added without consent"
    client = client_for()
    client.force_login(squatter)
    assert client.get("/api/invitations").json()["results"] == []
    accept = client.post(f"/api/invitations/{invitation['id']}/accept")
    assert accept.status_code == 404 and "confirm" in accept.json()["error"]["message"]
    page = client.post("/invitations/", {"invitation": invitation["id"], "answer": "accept"}, follow=True)
    assert page.status_code == 200
    assert not Membership.objects.filter(workspace=workspace, user=squatter).exists()


def test_the_invitee_accepts_once_from_the_confirmed_address(members, workspace):
    hire = person(HIRE, confirmed=True)
    invitation = invite(members, workspace, role="member")
    client = client_for()
    client.force_login(hire)
    listed = client.get("/api/invitations").json()["results"]
    assert [i["id"] for i in listed] == [invitation["id"]] and listed[0]["workspaceName"] == workspace.name
    accepted = client.post(f"/api/invitations/{invitation['id']}/accept")
    assert accepted.status_code == 200 and accepted.json()["role"] == "member"
    assert Membership.objects.get(workspace=workspace, user=hire).role == Role.MEMBER
    again = client.post(f"/api/invitations/{invitation['id']}/accept")
    assert again.status_code == 404  # answered: no longer pending


def test_someone_else_cannot_answer_an_invitation(members, workspace):
    invitation = invite(members, workspace)
    other = person("someone.else@example.com", confirmed=True)
    client = client_for()
    client.force_login(other)
    assert client.post(f"/api/invitations/{invitation['id']}/accept").status_code == 404
    assert client.post(f"/api/invitations/{invitation['id']}/decline").status_code == 404
    assert Invitation.objects.get(id=invitation["id"]).declined_at is None


def test_declining_leaves_the_workspace_as_it_was(members, workspace):
    hire = person(HIRE, confirmed=True)
    invitation = invite(members, workspace)
    client = client_for()
    client.force_login(hire)
    assert client.post(f"/api/invitations/{invitation['id']}/decline").status_code == 204
    assert not Membership.objects.filter(workspace=workspace, user=hire).exists()
    assert client.get("/api/invitations").json()["results"] == []


def test_an_api_key_cannot_answer_invitations_to_other_workspaces(members, workspace):
    """A key acts in its own workspace only: it cannot take its owner into another one."""
    hire = person(HIRE, confirmed=True)
    own = Membership.objects.create(workspace=members["outsider"].workspace, user=hire, role=Role.OWNER)
    invitation = invite(members, workspace)
    key = client_for(key=api_key_for(own))
    assert key.get("/api/invitations").status_code == 403
    assert key.post(f"/api/invitations/{invitation['id']}/accept").status_code == 403
    assert not Membership.objects.filter(workspace=workspace, user=hire).exists()


def test_an_invitation_to_an_existing_member_is_refused(members, workspace):
    response = client_for(members[Role.OWNER]).post(
        f"/api/workspaces/{workspace.id}/invitations",
        {"email": members[Role.VIEWER].user.email},
        format="json",
    )
    assert response.status_code == 409


def test_a_workspace_cannot_make_the_platform_a_phishing_relay(
    members, workspace, settings, mailoutbox, django_capture_on_commit_callbacks
):
    """Anyone could invite any number of addresses, with a subject of the workspace's choosing."""
    settings.INVITATIONS_PER_DAY = 2
    workspace.name = "URGENT verify your bank account"
    workspace.save()
    for n in range(2):
        with django_capture_on_commit_callbacks(execute=True):
            invite(members, workspace, email=f"target{n}@example.com")
    subject, body = mailoutbox[0].subject, mailoutbox[0].body
    assert workspace.name not in subject
    assert f"named it “{workspace.name}”" in body
    refused = client_for(members[Role.OWNER]).post(
        f"/api/workspaces/{workspace.id}/invitations", {"email": "target2@example.com"}, format="json"
    )
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert "2 invitations in a day" in refused.json()["error"]["message"]
    assert len(mailoutbox) == 2 and not Invitation.objects.filter(email="target2@example.com").exists()
    with (
        time_machine.travel(timezone.now() + timedelta(days=1, minutes=1)),
        django_capture_on_commit_callbacks(execute=True),
    ):
        invite(members, workspace, email="target2@example.com")
    assert len(mailoutbox) == 3


# The invitation's own page, from the link its e-mail carries.


def invite_by_page(client, admin, workspace, email=HIRE, role="member", capture=None):
    client.force_login(admin.user)
    with capture(execute=True):
        client.post(f"/w/{workspace.id}/members/invite/", {"email": email, "role": role})
    client.logout()
    body = mail.outbox[-1].body
    return re.search(r"http://\S+(/invitations/\S+/)", body).group(1)


def states_seen_by(client, admin, workspace) -> dict[str, str]:
    client.force_login(admin.user)
    page = client.get(f"/w/{workspace.id}/settings/").content.decode()
    client.logout()
    return {email: state for state, email in re.findall(r'data-state="(\w+)"><td>([^<]+)</td>', page)}


def test_a_newcomer_follows_the_link_signs_up_and_lands_in_the_inviters_workspace(
    client, members, workspace, django_capture_on_commit_callbacks
):
    link = invite_by_page(client, members[Role.ADMIN], workspace, capture=django_capture_on_commit_callbacks)
    page = client.get(link).content.decode()
    assert workspace.name in page and members[Role.ADMIN].user.email in page and HIRE in page
    assert f"Rejoindre {workspace.name}" in client.get(link, HTTP_ACCEPT_LANGUAGE="fr").content.decode()
    signup = f"/accounts/signup/?{urlencode({'email': HIRE, 'next': link})}"
    assert signup.replace("&", "&amp;") in page
    # Following the e-mailed link proved the address: no confirmation e-mail to wait for.
    sent = client.post(signup, {"email": HIRE, "password1": PASSWORD, "password2": PASSWORD})
    assert sent.status_code == 302 and sent.url == link
    hire = User.objects.get(email=HIRE)
    assert hire.emailaddress_set.get(email=HIRE).verified
    assert not Membership.objects.filter(user=hire).exists()  # no empty workspace of their own
    assert states_seen_by(client_for(), members[Role.OWNER], workspace) == {HIRE: "sent"}
    client.force_login(hire)
    assert client.get("/").url == "/invitations/"
    assert "Accept and join" in client.get(link).content.decode()
    assert states_seen_by(client_for(), members[Role.OWNER], workspace) == {HIRE: "to_accept"}
    accepted = client.post(link, {"answer": "accept"})
    assert accepted.url == f"/w/{workspace.id}/desktops/"
    assert [m.workspace_id for m in Membership.objects.filter(user=hire)] == [workspace.id]
    assert f"Welcome to {workspace.name}" in client.get(accepted.url).content.decode()
    assert states_seen_by(client_for(), members[Role.OWNER], workspace) == {}  # a member now
    assert client.get(link).status_code == 404  # answered: the link is spent


def test_signing_up_without_the_link_says_to_confirm_the_address_and_the_owner_sees_it(
    client, members, workspace, django_capture_on_commit_callbacks
):
    link = invite_by_page(client, members[Role.ADMIN], workspace, capture=django_capture_on_commit_callbacks)
    with django_capture_on_commit_callbacks(execute=True):
        client.post("/accounts/signup/", {"email": HIRE, "password1": PASSWORD, "password2": PASSWORD})
    hire = User.objects.get(email=HIRE)
    assert not hire.emailaddress_set.get(email=HIRE).verified
    assert not Membership.objects.filter(user=hire).exists()
    assert client.get("/").url == "/invitations/"
    page = client.get("/invitations/").content.decode()
    assert f"An invitation waits for {HIRE}: confirm that address" in page and workspace.name not in page
    page = client.get(link).content.decode()
    assert f"Confirm your address {HIRE} to accept" in page and "Accept and join" not in page
    assert states_seen_by(client_for(), members[Role.OWNER], workspace) == {HIRE: "to_confirm"}
    assert client.post(link, {"answer": "accept"}).status_code == 302
    assert not Membership.objects.filter(user=hire, workspace=workspace).exists()
    # Not joining anyone after all: a workspace of their own, on request.
    client.post("/invitations/", {"answer": "own"})
    assert Membership.objects.get(user=hire).role == Role.OWNER


def test_an_account_says_nothing_to_the_inviters_before_its_owner_opens_the_link(
    client, members, workspace, django_capture_on_commit_callbacks
):
    person(HIRE, confirmed=True)  # an account with the address exists, confirmed
    invite_by_page(client, members[Role.ADMIN], workspace, capture=django_capture_on_commit_callbacks)
    invite_by_page(
        client,
        members[Role.ADMIN],
        workspace,
        "nobody@example.com",
        capture=django_capture_on_commit_callbacks,
    )
    assert states_seen_by(client_for(), members[Role.OWNER], workspace) == {
        HIRE: "sent",
        "nobody@example.com": "sent",
    }


def test_someone_else_holding_the_link_cannot_accept_it(
    client, members, workspace, django_capture_on_commit_callbacks
):
    link = invite_by_page(client, members[Role.ADMIN], workspace, capture=django_capture_on_commit_callbacks)
    other = person("someone.else@example.com", confirmed=True)
    client.force_login(other)
    page = client.get(link).content.decode()
    assert f"This invitation is for {HIRE}" in page and "Accept and join" not in page
    client.post(link, {"answer": "accept"})
    client.post(link, {"answer": "decline"})
    invitation = Invitation.objects.get(email=HIRE)
    assert invitation.accepted_at is None and invitation.declined_at is None and invitation.opened_by is None
    assert not Membership.objects.filter(user=other, workspace=workspace).exists()
    # A link made up, or one for another invitation's id signed without the site's key, leads nowhere.
    forged = signing.dumps(invitation.id, key="not the site's key", salt="lebureau.invitation")
    assert client.get(f"/invitations/{forged}/").status_code == 404
    assert client.get(f"/invitations/{invitation.id}/").status_code == 404


def test_a_link_opened_before_signing_up_verifies_no_other_address(
    client, members, workspace, django_capture_on_commit_callbacks
):
    # The attacker invites an address of their own and hands the link to the victim, who opens it signed
    # out and then signs up with their own address, in the same session.
    attacker_alias = "alias@attacker.example"
    link = invite_by_page(
        client, members[Role.ADMIN], workspace, attacker_alias, capture=django_capture_on_commit_callbacks
    )
    assert client.get(link).status_code == 200
    victim_email = "victim@example.com"
    client.post("/accounts/signup/", {"email": victim_email, "password1": PASSWORD, "password2": PASSWORD})
    victim = User.objects.get(email=victim_email)
    # Only the address typed is on the account, and unconfirmed: the alias gives the attacker no reset.
    assert list(victim.emailaddress_set.values_list("email", "verified", "primary")) == [
        (victim_email, False, True)
    ]
    assert not User.objects.filter(email=attacker_alias).exists()
    client.logout()
    mail.outbox.clear()
    client.post("/accounts/password/reset/", {"email": attacker_alias})
    assert all(victim_email not in m.to and "reset" not in m.subject.lower() for m in mail.outbox)


def test_an_expired_link_proves_nothing_and_says_so(
    client, members, workspace, django_capture_on_commit_callbacks
):
    link = invite_by_page(client, members[Role.ADMIN], workspace, capture=django_capture_on_commit_callbacks)
    assert client.get(link).status_code == 200  # opened in time, signed up with after it expired
    with time_machine.travel(timezone.now() + timedelta(days=8)):
        page = client.get(link)
        assert page.status_code == 404 and "expired" in page.content.decode()
        client.post("/accounts/signup/", {"email": HIRE, "password1": PASSWORD, "password2": PASSWORD})
    assert not User.objects.get(email=HIRE).emailaddress_set.get(email=HIRE).verified


def test_a_withdrawn_invitation_and_a_removed_member_are_invited_again_in_one_click(
    client, members, workspace, django_capture_on_commit_callbacks
):
    link = invite_by_page(client, members[Role.ADMIN], workspace, capture=django_capture_on_commit_callbacks)
    client.force_login(members[Role.ADMIN].user)
    invitation = Invitation.objects.get(email=HIRE)
    page = client.post(
        f"/w/{workspace.id}/invitations/{invitation.id}/withdraw/", follow=True
    ).content.decode()
    assert f"Invite {HIRE} again" in page and client.get(link).status_code == 404
    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/w/{workspace.id}/members/invite/", {"email": HIRE, "role": "member"})
    assert Invitation.objects.get(email=HIRE).role == "member" and HIRE in mail.outbox[-1].to
    viewer = members[Role.VIEWER]
    page = client.post(f"/w/{workspace.id}/members/{viewer.id}/remove/", follow=True).content.decode()
    assert f"Invite {viewer.user.email} again" in page
    assert (
        f"Invite {viewer.user.email} again" not in client.get(f"/w/{workspace.id}/settings/").content.decode()
    )


# Roles


def test_a_member_cannot_change_roles_and_the_last_owner_cannot_step_down(client, members, workspace):
    owner, viewer = members[Role.OWNER], members[Role.VIEWER]
    client.force_login(members[Role.MEMBER].user)
    client.post(f"/w/{workspace.id}/members/{viewer.id}/role/", {"role": "admin"})
    client.post(f"/w/{workspace.id}/members/{owner.id}/role/", {"role": "viewer"})
    client.force_login(owner.user)
    page = client.post(f"/w/{workspace.id}/members/{owner.id}/role/", {"role": "viewer"}, follow=True)
    assert "keeps at least one owner" in page.content.decode()
    client.post(f"/w/{workspace.id}/members/{owner.id}/remove/")
    assert {m.id: m.role for m in workspace.memberships.filter(id__in=[owner.id, viewer.id])} == {
        owner.id: Role.OWNER,
        viewer.id: Role.VIEWER,
    }


def _demote(actor, target, workspace, start, refused):
    start.wait()
    try:
        services.membership_set_role(
            actor=Actor(user=actor.user), workspace_id=workspace.id, membership_id=target.id, role="admin"
        )
    except (Conflict, Forbidden):  # no owner left but them, or no longer an owner themselves
        refused.append(target.id)
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_two_owners_demoting_each_other_at_once_leave_one_owner(workspace):
    """Each sees the other as an owner still; changes to the members wait for each other, so the second
    finds the first gone and is refused."""
    for _round in range(5):
        first, second = (MembershipFactory(workspace=workspace, role=Role.OWNER) for _ in range(2))
        start, refused = threading.Barrier(2), []
        threads = [
            threading.Thread(target=_demote, args=(*pair, workspace, start, refused))
            for pair in ((first, second), (second, first))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(refused) == 1
        assert workspace.memberships.filter(role=Role.OWNER).count() == 1
        workspace.memberships.all().delete()
