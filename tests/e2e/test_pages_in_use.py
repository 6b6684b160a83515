"""Mission Control's pages in use, in real Chromium: what a person expects of them beyond their data.

The desktops here are rows only (no engine runs them): these tests are about the pages themselves.
"""

import pytest
from playwright.sync_api import expect

from desktops import approvals
from desktops.models import ApiKey, ChatMessage, DesktopState, LLMKey, Role
from tests.e2e.conftest import log_in, screenshot
from tests.factories import DesktopFactory, MembershipFactory, api_key_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.e2e]


def test_the_viewers_tabs_take_the_chats_place_and_enter_sends(page, site, workspace, plan):
    desktop = DesktopFactory(workspace=workspace, state=DesktopState.RUNNING, name="tabs-desk")
    desktop.events.create(from_state="starting", to_state="running", actor="test")
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    log_in(page, site, member.user.email)
    page.goto(f"{site}/desktops/{desktop.id}/")

    # The other tabs take the chat's place, not a place under its Send button.
    page.click("[data-tab=timeline-panel]")
    expect(page.locator("#chat-panel")).to_be_hidden()
    expect(page.locator("#timeline-panel")).to_be_visible()
    page.click("[data-tab=details-panel]")
    expect(page.locator("#timeline-panel")).to_be_hidden()
    page.click("[data-tab=chat-panel]")
    expect(page.locator("#chat-panel")).to_be_visible()

    # Enter sends; Shift+Enter makes a new line.
    page.click("#chat-text")
    page.keyboard.type("Première ligne")
    page.keyboard.press("Shift+Enter")
    page.keyboard.type("seconde ligne")
    expect(page.locator("#chat-text")).to_have_value("Première ligne\nseconde ligne")
    page.keyboard.press("Enter")
    expect(page.locator("#chat-log li.operator")).to_have_text("Première ligne\nseconde ligne")
    expect(page.locator("#chat-text")).to_have_value("")
    assert (
        ChatMessage.objects.get(desktop=desktop, author="operator").content == "Première ligne\nseconde ligne"
    )
    screenshot(page, "pages-01-chat-enter")


def test_a_first_task_with_no_llm_key_says_what_to_do_and_is_sent_again_in_one_click(
    browser, site, workspace, plan
):
    """A newcomer's first task: the chat said "L'agent travaille…" and nothing told them to add a key."""
    desktop = DesktopFactory(
        workspace=workspace, state=DesktopState.RUNNING, image_profile="full", name="premier"
    )
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    context = browser.new_context(locale="fr-FR")
    page = context.new_page()
    try:
        log_in(page, site, member.user.email)
        page.goto(f"{site}/desktops/{desktop.id}/")
        # Before sending: the chat says what the agent needs, and whom to ask.
        expect(page.locator("#no-llm-key")).to_contain_text(
            "L'agent répond une fois que l'espace de travail a une clé LLM"
        )
        page.fill("#chat-text", "Range le bureau")
        page.click("#chat-form button")
        # After: at once, the failure in words, the fix and sending again; no words of a runtime never run.
        failed = page.locator("#chat-log li.agent.error")
        expect(failed).to_contain_text("Aucune clé LLM", timeout=5000)
        expect(failed.get_by_role("link", name="Ouvrir les Réglages")).to_be_visible()
        expect(failed.locator("details")).to_have_count(0)
        screenshot(page, "pages-00-first-task-no-key")
        failed.get_by_role("button", name="Réessayer").click()
        expect(failed).to_have_count(2)
        assert list(
            ChatMessage.objects.filter(desktop=desktop, author="operator").values_list("content", flat=True)
        ) == ["Range le bureau", "Range le bureau"]
    finally:
        context.close()


def test_after_a_failed_turn_the_chat_says_the_queue_went_on(page, site, workspace, plan):
    """After a failure the next queued message started silently."""
    desktop = DesktopFactory(workspace=workspace, state=DesktopState.RUNNING, name="file")
    for text, status in (("Premier", ChatMessage.Status.ERROR), ("Second", ChatMessage.Status.QUEUED)):
        asked = ChatMessage.objects.create(desktop=desktop, author="operator", content=text)
        ChatMessage.objects.create(
            desktop=desktop, author="agent", reply_to=asked, status=status, content="boom"
        )
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    log_in(page, site, member.user.email)
    page.goto(f"{site}/desktops/{desktop.id}/")
    failed = page.locator("#chat-log li.agent.error")
    expect(failed.locator(".goes-on")).to_have_text(
        "The next message in the queue went on to the agent all the same."
    )
    expect(failed.locator("details")).to_contain_text("boom")  # the runtime's words, whatever they were


def test_the_landing_page_and_the_viewer_ask_for_nothing_that_is_not_there(page, site, workspace, plan):
    """Both asked for an asset the site did not have (a 404 in the browser's console): a browser asks for
    the site's icon at /favicon.ico unless the page names one, and none was named."""
    missing = []
    page.on("response", lambda response: response.status == 404 and missing.append(response.url))
    page.goto(f"{site}/")
    page.wait_for_load_state("networkidle")
    icon = page.locator("link[rel=icon]").get_attribute("href")
    assert page.request.get(f"{site}{icon}").ok
    desktop = DesktopFactory(workspace=workspace, state=DesktopState.RUNNING)
    log_in(page, site, MembershipFactory(workspace=workspace, role=Role.MEMBER).user.email)
    page.goto(f"{site}/desktops/{desktop.id}/")
    page.fill("#chat-text", "Bonjour")
    page.keyboard.press("Enter")
    expect(page.locator("#chat-log li.operator")).to_have_text("Bonjour")
    page.wait_for_load_state("networkidle")
    assert missing == []


def test_a_comment_being_typed_survives_the_live_list_reloading(page, site, workspace, plan):
    desktop = DesktopFactory(workspace=workspace, state=DesktopState.RUNNING, name="asking-desk")
    first = approvals.approval_request(desktop=desktop, title="Pousser la branche")
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    log_in(page, site, member.user.email)
    page.goto(f"{site}/w/{workspace.id}/approvals/")
    comment = page.locator(f"li[data-approval={first.id}] input[name=comment]")
    comment.fill("Oui, mais pas de force-push")

    # Another request arrives while the operator types: the list is fetched again around the field.
    approvals.approval_request(desktop=desktop, title="Vider le cache")
    expect(page.locator("li.approval.pending")).to_have_count(2, timeout=15000)
    expect(comment).to_have_value("Oui, mais pas de force-push")
    expect(comment).to_be_focused()
    page.keyboard.type(" ce soir")
    page.locator(f"li[data-approval={first.id}] button[value=approve]").click()
    expect(page.locator("li.approval.pending")).to_have_count(1, timeout=15000)
    first.refresh_from_db()
    assert (first.status, first.comment) == ("approved", "Oui, mais pas de force-push ce soir")


@pytest.mark.parametrize(("width", "height"), [(1440, 900), (390, 844)])
def test_destroying_asks_for_the_names_and_revoking_names_the_key(page, site, workspace, plan, width, height):
    owner = MembershipFactory(workspace=workspace, role=Role.OWNER)
    desktops = {
        name: DesktopFactory(workspace=workspace, state=DesktopState.STOPPED, name=name)
        for name in ("alpha", "beta", "gamma")
    }
    api_key_for(owner)
    key = ApiKey.objects.get(workspace=workspace)
    page.set_viewport_size({"width": width, "height": height})
    log_in(page, site, owner.user.email)
    dialog, typed, confirm = (
        page.locator("#destroy-dialog"),
        page.locator("#destroy-typed"),
        page.locator("#destroy-confirm"),
    )

    page.check("input[data-name=alpha]")
    page.check("input[data-name=gamma]")
    page.click("button[value=destroy]")
    # Each desktop named, with its disk and what goes with it; the button waits for their names.
    expect(dialog).to_be_visible()
    expect(page.locator("#destroy-title")).to_have_text("Destroy 2 desktops?")
    expect(page.locator("#destroy-list li")).to_have_text(
        [
            f"alpha — its {plan.disk_gib} GiB disk and everything on it",
            f"gamma — its {plan.disk_gib} GiB disk and everything on it",
        ]
    )
    expect(dialog).to_contain_text("the agent's memory and conversations")
    expect(confirm).to_be_disabled()
    typed.fill("2")
    expect(confirm).to_be_disabled()
    typed.fill("alpha beta")
    expect(confirm).to_be_disabled()
    typed.fill("gamma alpha")
    expect(confirm).to_be_enabled()
    screenshot(page, f"destroy-01-names-typed-{width}")
    page.keyboard.press("Escape")  # called off: nothing destroyed
    expect(dialog).to_be_hidden()
    page.wait_for_timeout(300)
    assert {d.state for d in workspace.desktops.all()} == {"stopped"}

    page.click("button[value=destroy]")
    expect(typed).to_have_value("")
    typed.fill("alpha, gamma")
    confirm.click()
    expect(page.locator(".messages")).to_contain_text("alpha: “Destroy” asked.")
    expect(page.locator(".messages")).to_contain_text("gamma: “Destroy” asked.")
    # Destroying, or already destroyed where a worker of the suite runs meanwhile.
    states = {d.name: d.state.replace("destroyed", "destroying") for d in workspace.desktops.all()}
    assert states == {"alpha": "destroying", "beta": "stopped", "gamma": "destroying"}
    screenshot(page, f"destroy-02-requested-{width}")

    # One desktop, from its viewer: its name, typed.
    page.goto(f"{site}/desktops/{desktops['beta'].id}/")
    page.click("#lifecycle [data-action=destroy]")
    expect(page.locator("#destroy-title")).to_have_text("Destroy 1 desktop?")
    typed.fill("alpha")
    expect(confirm).to_be_disabled()
    typed.fill("beta")
    screenshot(page, f"destroy-03-viewer-{width}")
    confirm.click()
    page.wait_for_url(f"{site}/w/{workspace.id}/desktops/")
    assert workspace.desktops.get(name="beta").state in ("destroying", "destroyed")

    questions = []

    def answer(dialog):
        questions.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", answer)
    page.goto(f"{site}/w/{workspace.id}/settings/")
    page.click("text=Revoke")
    assert key.name in questions[-1] and key.prefix in questions[-1]
    page.wait_for_timeout(300)
    assert ApiKey.objects.get(id=key.id).revoked_at is None  # called off: nothing revoked
    page.remove_listener("dialog", answer)
    page.on("dialog", lambda dialog: dialog.accept())
    page.click("text=Revoke")
    expect(page.locator(".messages")).to_contain_text("API key revoked")
    assert ApiKey.objects.get(id=key.id).revoked_at is not None


def test_a_filter_with_no_match_says_so(page, site, workspace, plan):
    DesktopFactory(workspace=workspace, name="alpha")
    member = MembershipFactory(workspace=workspace, role=Role.VIEWER)
    log_in(page, site, member.user.email)
    page.goto(f"{site}/w/{workspace.id}/desktops/?q=zeta")
    expect(page.locator("#desktop-rows")).to_contain_text("No desktop matches these filters.")
    page.click("text=Show them all")
    expect(page.locator("#desktop-rows")).to_contain_text("alpha")


# The cards whose content is wider than they are (so clipped, or reachable only by scrolling inside them).
CLIPPED_CARDS = """[...document.querySelectorAll('.card, .grid2 > *')]
  .filter((card) => card.scrollWidth > card.clientWidth + 1)
  .map((card) => `${card.id || card.querySelector('h2')?.textContent || card.className}: `
    + `${card.scrollWidth} > ${card.clientWidth}`)"""


@pytest.mark.parametrize(("width", "height"), [(1440, 900), (1280, 800), (390, 844)])
def test_the_pages_fit_the_window_and_no_card_clips_its_content(page, site, workspace, plan, width, height):
    """On Settings the LLM keys card was squeezed into a column, its provider's answer and buttons clipped."""
    owner = MembershipFactory(workspace=workspace, role=Role.OWNER)
    DesktopFactory(workspace=workspace, name="a-desktop-with-a-rather-long-name")
    api_key_for(owner)
    LLMKey.objects.create(
        workspace=workspace,
        provider="openai_compatible",
        name="a-key-with-a-long-name",
        base_url="https://llm.example.com/v1",
        model="a-model-with-a-long-name",
        secret_encrypted="-",
        last4="1234",
        verdict="unreachable",
        check_detail="injoignable : connexion refusée par llm.example.com (port 443)",
    )
    log_in(page, site, owner.user.email)
    page.set_viewport_size({"width": width, "height": height})
    for name, path in (("desktops", "desktops"), ("settings", "settings"), ("costs", "costs")):
        page.goto(f"{site}/w/{workspace.id}/{path}/")
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        screenshot(page, f"pages-{name}-{width}")
        assert overflow <= 0, f"{name} is {overflow} px wider than a {width} px window"
        assert page.evaluate(CLIPPED_CARDS) == [], f"{name} at {width} px"
    # The key form's inputs are named on the page, not only by placeholders that typing hides.
    page.goto(f"{site}/w/{workspace.id}/settings/")
    for field in ("provider", "name", "base_url", "model", "secret"):
        expect(page.locator(f"#llm-key-form label:has([name={field}])")).to_be_visible()


def test_on_a_phone_the_links_fit_the_desktops_start_on_the_first_screen_and_the_chat_follows_the_screen(
    browser, site, workspace, plan
):
    """At 390 by 844 px the header ran a tab off the edge, the rows began more than a screen down, and the
    viewer was a black letterbox with the chat screens below."""
    for i in range(3):
        DesktopFactory(workspace=workspace, state=DesktopState.RUNNING, name=f"telephone-{i}")
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    context = browser.new_context(locale="fr-FR", viewport={"width": 390, "height": 844}, is_mobile=True)
    page = context.new_page()
    try:
        log_in(page, site, member.user.email)
        page.goto(f"{site}/w/{workspace.id}/desktops/")
        off_the_edge = page.evaluate(
            "[...document.querySelectorAll('header.top a, header.top button, header.top summary')]"
            ".filter((el) => el.getBoundingClientRect().right > window.innerWidth)"
            ".map((el) => el.textContent)"
        )
        assert off_the_edge == []
        first_row = page.locator("#desktop-rows tr").first.bounding_box()
        assert first_row["y"] < 844, f"the first desktop starts {first_row['y']:.0f} px down"
        screenshot(page, "phone-01-desktops")
        page.goto(f"{site}/desktops/{workspace.desktops.first().id}/")
        expect(page.locator("#chat-text")).to_be_visible()
        screen, chat = page.locator("#screen").bounding_box(), page.locator("#chat-text").bounding_box()
        assert abs(screen["height"] - screen["width"] * 10 / 16) < 2, screen  # its proportions, full width
        screenshot(page, "phone-02-viewer")
        assert chat["y"] < 844, f"the chat starts {chat['y']:.0f} px down"
    finally:
        context.close()


@pytest.mark.parametrize(("width", "height"), [(1440, 900), (390, 844)])
def test_a_french_browser_gets_french_pages(browser, site, workspace, plan, width, height):
    desktop = DesktopFactory(workspace=workspace, state=DesktopState.STOPPED, name="bureau-fr")
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    context = browser.new_context(locale="fr-FR", viewport={"width": width, "height": height})
    page = context.new_page()
    try:
        log_in(page, site, member.user.email)
        expect(page.locator("h1")).to_have_text("Bureaux")
        expect(page.locator("#fleet-summary")).to_contain_text("ce mois-ci jusqu'à présent")
        expect(page.locator("#live")).to_have_text("en direct", timeout=10000)
        expect(page.locator('[data-field="state"]')).to_have_text("arrêté")
        # Opened, New Computer has one primary button: the seed's "Provisionner".
        page.click("#new-computer summary")
        primary = page.evaluate(
            """[...document.querySelectorAll('#new-computer button, #new-computer summary')]
              .filter((el) => getComputedStyle(el).backgroundColor === getComputedStyle(
                document.querySelector('#new-computer button.primary')).backgroundColor)
              .map((el) => el.textContent.trim())"""
        )
        assert primary == ["Provisionner"], primary
        screenshot(page, f"fr-desktops-{width}")
        page.goto(f"{site}/desktops/{desktop.id}/")
        expect(page.locator("#not-running")).to_contain_text("Le bureau n'est pas en marche")
        expect(page.locator("#state")).to_have_text("arrêté")  # the state too, in French
        expect(page.locator("[data-action=start]")).to_have_text("Démarrer")
        expect(page.locator("#chat-log")).to_contain_text("Aucun message pour l'instant.")
        expect(page.locator("#screen-status")).to_contain_text("reviennent quand il tourne de nouveau")
        screenshot(page, f"fr-viewer-{width}")
    finally:
        context.close()


@pytest.mark.parametrize(
    ("form_path", "fill", "shown", "looks_right"),
    [
        (
            "keys/new/",
            lambda form: form.locator("input[name=name]").fill("ci"),
            "new-token",
            lambda v: v.startswith("lb_"),
        ),
        (
            "settings/approvals/",
            lambda form: form.locator("input[name=rotate_secret]").check(),
            "new-webhook-secret",
            lambda v: len(v) > 20,
        ),
    ],
    ids=["api-key", "webhook-secret"],
)
def test_a_secret_shown_once_is_copied_in_one_click(
    browser, site, workspace, plan, form_path, fill, shown, looks_right
):
    admin = MembershipFactory(workspace=workspace, role=Role.ADMIN)
    context = browser.new_context(permissions=["clipboard-read", "clipboard-write"])
    page = context.new_page()
    try:
        log_in(page, site, admin.user.email)
        page.goto(f"{site}/w/{workspace.id}/settings/")
        form = page.locator(f"form[action='/w/{workspace.id}/{form_path}']")
        fill(form)
        form.locator("button").click()
        secret = page.locator(f"#{shown}").inner_text().strip()
        page.click(f"[data-copy={shown}]")
        expect(page.locator(f"[data-copy={shown}]")).to_have_text("Copied")
        assert page.evaluate("navigator.clipboard.readText()") == secret and looks_right(secret)
    finally:
        context.close()
