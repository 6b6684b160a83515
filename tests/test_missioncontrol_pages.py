"""Mission Control pages: role checks on every page and action, and what each one does."""

import ipaddress

import pytest
from django.core import mail

from desktops import approvals, services
from desktops.audit import Actor
from desktops.models import ApiKey, Approval, AuditEvent, DesktopState, Invitation, LLMKey, Role
from tests.factories import DesktopFactory, MembershipFactory, UserFactory, audit_event


def logged_in(client, membership):
    client.force_login(membership.user)
    return client


def page_urls(ws, desktop):
    return [
        f"/w/{ws.id}/desktops/",
        f"/w/{ws.id}/settings/",
        f"/desktops/{desktop.id}/",
        f"/w/{ws.id}/approvals/",
        f"/w/{ws.id}/approvals/?fragment=1&desktop={desktop.id}",
        f"/w/{ws.id}/alerts/",
        f"/w/{ws.id}/alerts/?status=&kind=error&desktop={desktop.id}&fragment=1",
    ]


@pytest.mark.parametrize("role", [Role.OWNER, Role.ADMIN, Role.MEMBER, Role.VIEWER, "outsider"])
def test_pages_open_for_members_only(client, members, workspace, plan, role):
    desktop = DesktopFactory(workspace=workspace)
    logged_in(client, members[role])
    for url in page_urls(workspace, desktop):
        assert client.get(url).status_code == (404 if role == "outsider" else 200), url
    audit = client.get(f"/w/{workspace.id}/audit/").status_code
    expected = 404 if role == "outsider" else 200 if Role(role).rank >= Role.ADMIN.rank else 403
    assert audit == expected


def test_event_stream_is_for_members_only(client, members, workspace):
    logged_in(client, members["outsider"])
    assert client.get(f"/events/w/{workspace.id}/").status_code == 403
    client.logout()
    assert client.get(f"/events/w/{workspace.id}/").status_code == 403


def test_pages_need_a_login(client, workspace):
    response = client.get(f"/w/{workspace.id}/desktops/")
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_desktops_page_lists_with_state_plan_ip_and_cost(client, members, workspace, plan):
    alpha = DesktopFactory(workspace=workspace, name="alpha", private_ip="10.0.0.9")
    DesktopFactory(workspace=workspace, name="beta", state=DesktopState.STOPPED)
    DesktopFactory(name="elsewhere")
    page = logged_in(client, members[Role.VIEWER]).get(f"/w/{workspace.id}/desktops/").content.decode()
    assert "alpha" in page and "beta" in page and "elsewhere" not in page
    assert "10.0.0.9" in page and "€" in page and "starter" in page
    filtered = client.get(f"/w/{workspace.id}/desktops/?state=stopped").content.decode()
    assert "beta" in filtered and "alpha" not in filtered
    assert "New Computer" not in page  # viewers only watch
    services.chat_send(
        actor=Actor(user=members[Role.OWNER].user), desktop=alpha, message="Audit the invoices"
    )
    assert "Audit the invoices" in client.get(f"/w/{workspace.id}/desktops/").content.decode()


def test_new_computer_goes_through_the_service(client, members, workspace, plan):
    logged_in(client, members[Role.MEMBER])
    url = f"/w/{workspace.id}/desktops/new/"
    response = client.post(url, {"name": "agent-7", "plan": plan.id, "image_profile": "minimal"}, follow=True)
    assert "agent-7 is being provisioned" in response.content.decode()
    desktop = workspace.desktops.get(name="agent-7")
    assert desktop.state == "provisioning" and desktop.image_profile == "minimal"
    assert AuditEvent.objects.filter(action="desktop.create", target=desktop.id).exists()
    bad = client.post(url, {"name": "Bad Name", "plan": plan.id, "image_profile": "minimal"}, follow=True)
    assert "lowercase" in bad.content.decode()


def test_viewer_cannot_create(client, members, workspace, plan):
    logged_in(client, members[Role.VIEWER])
    response = client.post(f"/w/{workspace.id}/desktops/new/", {"name": "x", "plan": plan.id})
    assert response.status_code == 403


def test_fleet_actions_report_per_desktop_and_destroy_needs_the_names(client, members, workspace, plan):
    running = DesktopFactory(workspace=workspace, name="alpha")
    stopped = DesktopFactory(workspace=workspace, state="stopped", name="beta")
    other = DesktopFactory(workspace=workspace, state="stopped", name="gamma")
    logged_in(client, members[Role.MEMBER])
    url = f"/w/{workspace.id}/desktops/actions/"
    page = client.post(
        url, {"action": "stop", "desktops": [running.id, stopped.id]}, follow=True
    ).content.decode()
    assert f"{running.name}: “Stop” asked." in page and "Cannot stop a desktop that is stopped" in page
    # A count, a name short, a name too many, another desktop's name: nothing goes.
    for typed in ("2", "beta", "beta gamma alpha", "gamma alpha", ""):
        page = client.post(
            url, {"action": "destroy", "desktops": [stopped.id, other.id], "confirm": typed}, follow=True
        )
        assert "type the names of the selected desktops (beta, gamma)" in page.content.decode(), typed
        assert {d.state for d in workspace.desktops.filter(id__in=[stopped.id, other.id])} == {"stopped"}
    client.post(url, {"action": "destroy", "desktops": [stopped.id, other.id], "confirm": "gamma, beta"})
    assert {d.state for d in workspace.desktops.filter(id__in=[stopped.id, other.id])} == {"destroying"}


def test_fleet_action_cannot_reach_another_workspace(client, members, workspace, plan):
    foreign = DesktopFactory()
    logged_in(client, members[Role.OWNER])
    client.post(f"/w/{workspace.id}/desktops/actions/", {"action": "stop", "desktops": [foreign.id]})
    foreign.refresh_from_db()
    assert foreign.state == "running"


def test_settings_keys_are_for_admins_and_shown_once(client, members, workspace):
    logged_in(client, members[Role.MEMBER])
    assert client.post(f"/w/{workspace.id}/keys/new/", {"name": "ci", "scope": "read"}, follow=True)
    assert not ApiKey.objects.filter(workspace=workspace).exists()
    logged_in(client, members[Role.ADMIN])
    page = client.post(
        f"/w/{workspace.id}/keys/new/", {"name": "ci", "scope": "read"}, follow=True
    ).content.decode()
    key = ApiKey.objects.get(workspace=workspace)
    assert f"lb_{key.prefix}_" in page
    again = client.get(f"/w/{workspace.id}/settings/").content.decode()
    assert "copy it now" not in again
    client.post(f"/w/{workspace.id}/keys/{key.id}/revoke/")
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_llm_keys_add_rotate_remove_show_only_the_last_four(client, members, workspace):
    logged_in(client, members[Role.ADMIN])
    body = {"provider": "anthropic", "name": "main", "secret": "sk-ant-secret-0000-1234"}
    page = client.post(f"/w/{workspace.id}/llm-keys/new/", body, follow=True).content.decode()
    assert "…1234" in page and "sk-ant-secret" not in page
    key = LLMKey.objects.get(workspace=workspace)
    client.post(f"/w/{workspace.id}/llm-keys/{key.id}/rotate/", {"secret": "sk-ant-rotated-9999-5678"})
    key.refresh_from_db()
    assert key.last4 == "5678"
    client.post(f"/w/{workspace.id}/llm-keys/{key.id}/delete/")
    assert not LLMKey.objects.filter(workspace=workspace).exists()


def test_an_invitation_is_accepted_by_its_invitee_from_the_confirmed_address(
    client, members, workspace, django_capture_on_commit_callbacks
):
    logged_in(client, members[Role.ADMIN])
    with django_capture_on_commit_callbacks(execute=True):
        client.post(f"/w/{workspace.id}/members/invite/", {"email": "newcomer@example.com", "role": "viewer"})
    invitation = Invitation.objects.get(workspace=workspace)
    assert (
        mail.outbox and "newcomer@example.com" in mail.outbox[0].to and "/invitations/" in mail.outbox[0].body
    )
    newcomer = UserFactory(email="newcomer@example.com", confirmed=False)
    address = newcomer.emailaddress_set.get()
    client.force_login(newcomer)
    # Not yet confirmed: the invitation waits, and nothing joins.
    page = client.get("/invitations/").content.decode()
    assert "An invitation waits for newcomer@example.com: confirm that address" in page
    assert workspace.name not in page
    assert not newcomer.memberships.filter(workspace=workspace).exists()
    address.verified = True
    address.save()
    assert client.get("/").url == "/invitations/"  # invited, they answer before anything else
    assert workspace.name in client.get("/invitations/").content.decode()
    client.post("/invitations/", {"invitation": invitation.id, "answer": "accept"})
    assert newcomer.memberships.get(workspace=workspace).role == Role.VIEWER
    invitation.refresh_from_db()
    assert invitation.accepted_at is not None


def test_inviting_says_the_same_whether_the_address_has_an_account_or_not(client, members, workspace):
    """The invite form once added existing accounts at once and told so: a way to learn who has one."""
    existing = UserFactory()
    logged_in(client, members[Role.ADMIN])
    answers = [
        client.post(f"/w/{workspace.id}/members/invite/", {"email": email, "role": "member"}, follow=True)
        for email in (existing.email, "nobody-here@example.com")
    ]
    messages_shown = [[str(m) for m in answer.context["messages"]] for answer in answers]
    assert (
        messages_shown[0]
        == messages_shown[1]
        == ["Invitation sent: they join once they accept it from that address."]
    )
    assert not existing.memberships.filter(workspace=workspace).exists()


def test_roles_change_and_members_leave_by_the_settings_page(client, members, workspace):
    viewer = members[Role.VIEWER]
    logged_in(client, members[Role.MEMBER])
    client.post(f"/w/{workspace.id}/members/{viewer.id}/role/", {"role": "admin"})
    viewer.refresh_from_db()
    assert viewer.role == Role.VIEWER
    logged_in(client, members[Role.ADMIN])
    client.post(f"/w/{workspace.id}/members/{viewer.id}/role/", {"role": "member"})
    viewer.refresh_from_db()
    assert viewer.role == Role.MEMBER
    client.post(f"/w/{workspace.id}/members/{viewer.id}/remove/")
    assert not workspace.memberships.filter(id=viewer.id).exists()


def test_only_owners_delete_a_workspace_and_must_type_its_name(client, members, workspace):
    logged_in(client, members[Role.ADMIN])
    assert client.post(f"/w/{workspace.id}/settings/delete/", {"confirm": workspace.name}).status_code == 403
    logged_in(client, members[Role.OWNER])
    client.post(f"/w/{workspace.id}/settings/delete/", {"confirm": "wrong"})
    assert type(workspace).objects.filter(id=workspace.id).exists()
    client.post(f"/w/{workspace.id}/settings/delete/", {"confirm": workspace.name})
    assert not type(workspace).objects.filter(id=workspace.id).exists()


def test_audit_log_filters_and_exports_csv(client, members, workspace, plan):
    desktop = DesktopFactory(workspace=workspace)
    audit_event(email="a@example.com", action="desktop.stop", workspace_id=workspace.id, target=desktop.id)
    audit_event(email="b@example.com", action="api_key.create", workspace_id=workspace.id)
    audit_event(email="c@example.com", action="desktop.stop", workspace_id="ws_other")
    logged_in(client, members[Role.ADMIN])
    page = client.get(f"/w/{workspace.id}/audit/?action=desktop.").content.decode()
    assert "a@example.com" in page and "b@example.com" not in page and "c@example.com" not in page
    csv_response = client.get(f"/w/{workspace.id}/audit/?target={desktop.id}&format=csv")
    assert csv_response["Content-Type"] == "text/csv"
    body = b"".join(csv_response.streaming_content).decode()
    assert body.splitlines()[0].startswith("at,actor,action") and "a@example.com" in body and "b@" not in body


def test_member_of_two_workspaces_switches(client, members, workspace):
    member = members[Role.MEMBER]
    other = MembershipFactory(user=member.user, role=Role.OWNER).workspace
    logged_in(client, member)
    page = client.get(f"/w/{workspace.id}/desktops/").content.decode()
    assert other.name in page  # the switcher offers it
    assert client.get(f"/switch/?workspace={other.id}").url == f"/w/{other.id}/desktops/"
    # The same page of the other workspace; anything else the desktops page, never another site.
    assert client.get(f"/switch/?workspace={other.id}&to=settings").url == f"/w/{other.id}/settings/"
    for elsewhere in ("https://evil.example/", "audit", "admin:index", "logout"):
        assert client.get(f"/switch/?workspace={other.id}&to={elsewhere}").url == f"/w/{other.id}/desktops/"
    assert client.get("/").url == f"/w/{workspace.id}/desktops/"  # the last one opened


def test_the_approval_queue_shows_what_is_asked_and_only_the_policys_roles_answer(client, members, workspace):
    desktop = DesktopFactory(workspace=workspace, name="deployer", state=DesktopState.RUNNING)
    asked = approvals.approval_request(
        desktop=desktop, title="terraform apply", details="+ 3 to add", cwd="/infra"
    )
    elsewhere = approvals.approval_request(desktop=DesktopFactory(name="other-ws"), title="Ailleurs")
    queue = logged_in(client, members[Role.VIEWER]).get(f"/w/{workspace.id}/approvals/").content.decode()
    assert "terraform apply" in queue and "+ 3 to add" in queue and "/infra" in queue and "deployer" in queue
    assert "Ailleurs" not in queue
    assert 'value="approve"' not in queue  # viewers watch
    assert client.post(f"/approvals/{asked.id}/decide/", {"decision": "approve"}).status_code == 302
    assert Approval.objects.get(id=asked.id).status == "pending"
    # Another workspace's request is not found, let alone answered.
    logged_in(client, members[Role.MEMBER])
    assert client.post(f"/approvals/{elsewhere.id}/decide/", {"decision": "approve"}).status_code == 404
    assert 'value="approve"' in client.get(f"/w/{workspace.id}/approvals/").content.decode()
    client.post(f"/approvals/{asked.id}/decide/", {"decision": "deny", "comment": "Pas un vendredi."})
    denied = Approval.objects.get(id=asked.id)
    assert (denied.status, denied.comment, denied.decided_by) == (
        "denied",
        "Pas un vendredi.",
        members[Role.MEMBER].user,
    )
    assert Approval.objects.get(id=elsewhere.id).status == "pending"


def test_admins_set_the_approval_policy_and_webhook_and_see_its_secret_once(
    client, members, workspace, settings
):
    settings.WEBHOOK_ALLOWED_NETWORKS = [ipaddress.ip_network("127.0.0.1/32")]  # a receiver on loopback
    policy = {
        "approval_role": "admin",
        "approval_timeout": "15",
        "approval_commands": "git push\r\nhelm   upgrade\r\n\r\n",
        "webhook_url": "http://127.0.0.1:9/hook",
    }
    logged_in(client, members[Role.MEMBER])
    refused = client.post(f"/w/{workspace.id}/settings/approvals/", policy, follow=True).content.decode()
    assert "needs the admin role" in refused
    workspace.refresh_from_db()
    assert (workspace.approval_role, workspace.approval_webhook_url) == ("member", "")
    logged_in(client, members[Role.ADMIN])
    client.post(f"/w/{workspace.id}/settings/approvals/", policy)
    workspace.refresh_from_db()
    assert (workspace.approval_role, workspace.approval_timeout) == ("admin", 900)
    assert workspace.approval_commands == ["git push", "helm upgrade"]
    assert workspace.approval_webhook_url == "http://127.0.0.1:9/hook"
    shown = client.get(f"/w/{workspace.id}/settings/").content.decode()
    assert 'id="new-webhook-secret">whsec_' in shown
    assert "git push\nhelm upgrade</textarea>" in shown
    assert "whsec_" not in client.get(f"/w/{workspace.id}/settings/").content.decode()


def test_the_desktops_page_shows_which_desktops_wait_for_an_approval(client, members, workspace, plan):
    asking = DesktopFactory(workspace=workspace, name="asking", state=DesktopState.RUNNING)
    DesktopFactory(workspace=workspace, name="quiet", state=DesktopState.RUNNING)
    for title in ("un", "deux"):
        approvals.approval_request(desktop=asking, title=title)
    page = logged_in(client, members[Role.VIEWER]).get(f"/w/{workspace.id}/desktops/").content.decode()
    assert page.count("approvals waiting") == 1 and "2 approvals waiting" in page
