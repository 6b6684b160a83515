"""Joining a workspace takes the invitee's consent, from the invited address, confirmed.

The attack this stops: pre-register an account with a future hire's address, wait for the invitation
(as admin, say), and be added at once. Nobody is added without accepting, and only someone who has
confirmed the invited address can accept.
"""

import pytest

from desktops.models import Invitation, Membership, Role
from tests.conftest import client_for
from tests.factories import UserFactory, api_key_for

pytestmark = pytest.mark.django_db

HIRE = "future.hire@example.com"


def invite(members, workspace, email=HIRE, role="admin"):
    response = client_for(members[Role.OWNER]).post(
        f"/api/workspaces/{workspace.id}/invitations", {"email": email, "role": role}, format="json"
    )
    assert response.status_code == 201, response.content
    return response.json()


def person(email: str, *, confirmed: bool):
    user = UserFactory(email=email)
    user.emailaddress_set.create(email=email, verified=confirmed, primary=True)
    return user


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
