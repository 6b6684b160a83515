"""An invitation accepted in real Chromium: from the e-mailed link, a newcomer signs up and lands in the
inviter's workspace, while the owner watches where the invitation stands."""

import pytest
from allauth.account.models import EmailAddress, EmailConfirmationHMAC
from playwright.sync_api import expect

from desktops.models import Invitation, Membership, Role
from desktops.selectors import invitation_token
from tests.e2e.conftest import log_in, screenshot
from tests.factories import PASSWORD, MembershipFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]

HIRE = "new.hire@example.com"


@pytest.mark.parametrize(("width", "height"), [(1440, 900), (390, 844)])
def test_a_newcomer_accepts_an_invitation_from_its_link_and_lands_in_the_workspace(
    browser, site, workspace, width, height
):
    owner = MembershipFactory(workspace=workspace, role=Role.OWNER)
    size = {"width": width, "height": height}
    owner_context, hire_context = browser.new_context(viewport=size), browser.new_context(viewport=size)
    try:
        page = owner_context.new_page()
        log_in(page, site, owner.user.email)
        page.goto(f"{site}/w/{workspace.id}/settings/")
        invite = page.locator(f"form[action='/w/{workspace.id}/members/invite/']").last
        invite.locator("input[name=email]").fill(HIRE)
        invite.locator("select[name=role]").select_option("member")
        invite.locator("button").click()
        row = page.locator("tr.invitation", has_text=HIRE)
        expect(row).to_have_attribute("data-state", "sent")
        expect(row).to_contain_text("not opened yet")
        # The link the e-mail carries (signed with the site's key, as the web server signs it).
        link = f"{site}/invitations/{invitation_token(Invitation.objects.get(email=HIRE))}/"

        hire = hire_context.new_page()
        hire.goto(link)
        expect(hire.locator("h1")).to_have_text(f"Join {workspace.name}")
        expect(hire.locator("#invitation")).to_contain_text(owner.user.email)
        screenshot(hire, f"invitation-01-link-signed-out-{width}")
        hire.click(f"text=Sign up with {HIRE}")
        expect(hire.locator("input[name=email]")).to_have_value(HIRE)
        hire.fill("input[name=password1]", PASSWORD)
        hire.fill("input[name=password2]", PASSWORD)
        hire.click("button[type=submit]")
        # Back on the invitation, signed in, the address proven by the link: nothing to confirm.
        hire.wait_for_url(link)
        expect(hire.locator("button[value=accept]")).to_be_visible()
        screenshot(hire, f"invitation-02-to-accept-{width}")
        page.reload()
        expect(row).to_have_attribute("data-state", "to_accept")
        expect(row).to_contain_text("waiting for them to accept")
        page.locator("#members").scroll_into_view_if_needed()
        screenshot(page, f"invitation-02-owner-sees-it-opened-{width}")

        hire.click("button[value=accept]")
        hire.wait_for_url(f"{site}/w/{workspace.id}/desktops/")
        expect(hire.locator(".messages")).to_contain_text(f"Welcome to {workspace.name}")
        expect(hire.locator("#switcher summary")).to_contain_text(workspace.name)
        screenshot(hire, f"invitation-03-joined-{width}")
        assert [m.workspace_id for m in Membership.objects.filter(user__email=HIRE)] == [workspace.id]

        page.reload()
        expect(page.locator("tr.invitation")).to_have_count(0)
        expect(page.locator("#members")).to_contain_text(HIRE)
        page.locator("#members").scroll_into_view_if_needed()
        screenshot(page, f"invitation-04-owner-sees-the-member-{width}")
    finally:
        owner_context.close()
        hire_context.close()


def test_the_switcher_takes_a_member_of_two_workspaces_to_the_same_page_of_the_other(page, site, workspace):
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    other = MembershipFactory(user=member.user, role=Role.VIEWER).workspace
    log_in(page, site, member.user.email)
    page.goto(f"{site}/w/{workspace.id}/settings/")
    page.click("#switcher summary")
    expect(page.locator("#switcher a[aria-current]")).to_have_text(workspace.name)
    page.click(f"#switcher >> text={other.name}")
    page.wait_for_url(f"{site}/w/{other.id}/settings/")
    expect(page.locator("h1")).to_contain_text(other.name)


def test_an_invitee_signing_up_on_their_own_is_told_to_confirm_the_address_first(page, site, workspace):
    """Not through the link: nothing proves the address yet, so the invitation waits for it to be
    confirmed, and the page says so instead of opening an empty workspace of their own."""
    owner = MembershipFactory(workspace=workspace, role=Role.OWNER)
    Invitation.objects.create(workspace=workspace, email=HIRE, role=Role.VIEWER, invited_by=owner.user)
    page.set_viewport_size({"width": 1440, "height": 900})
    page.goto(f"{site}/accounts/signup/")
    page.fill("input[name=email]", HIRE)
    page.fill("input[name=password1]", PASSWORD)
    page.fill("input[name=password2]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{site}/invitations/")
    expect(page.locator("main")).to_contain_text(f"An invitation waits for {HIRE}: confirm that address")
    expect(page.locator("main")).not_to_contain_text(workspace.name)
    expect(page.locator("button[name=action_send]")).to_be_visible()
    screenshot(page, "invitation-05-confirm-the-address-first-1440")
    assert not Membership.objects.filter(user__email=HIRE).exists()

    # The link of the confirmation e-mail (signed with the site's key, as the web server signs it).
    address = EmailAddress.objects.get(email=HIRE)
    page.goto(f"{site}/accounts/confirm-email/{EmailConfirmationHMAC(address).key}/")
    page.click("button[type=submit]")
    page.wait_for_url(f"{site}/invitations/")
    page.click("button[value=accept]")
    page.wait_for_url(f"{site}/w/{workspace.id}/desktops/")
    assert [m.role for m in Membership.objects.filter(user__email=HIRE)] == [Role.VIEWER]
