"""The operator's chat with a real agent, in real Chromium: a key added in Settings, a task typed in
the viewer's chat pane, the answer streaming in while the agent is still writing it.

The desktop is a real LXC desktop of the full image running the real OpenClaw; the model is the
scripted OpenAI-compatible server (a double: no LLM is reachable here).
"""

import time

import pytest
from playwright.sync_api import expect

from desktops import services
from desktops.audit import Actor
from desktops.models import ChatMessage, Role
from tests.conftest import FULL_IMAGE, SCRIPTED_MODEL_URL
from tests.e2e.conftest import let_the_network_settle, log_in, screenshot
from tests.factories import MembershipFactory
from tests.support.desktops import provision, run
from tests.support.scripted_model import Text, ToolCall

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.e2e,
    pytest.mark.lxc,
    pytest.mark.skipif(not FULL_IMAGE.is_file(), reason="no full golden image (make setup builds it)"),
]


def test_a_task_in_the_chat_pane_is_done_and_its_answer_streams_in(
    page, site, lxc_api, workspace, scripted_model
):
    admin = MembershipFactory(workspace=workspace, role=Role.ADMIN)
    log_in(page, site, admin.user.email)

    # The admin brings the workspace's own model key, in Settings.
    page.goto(f"{site}/w/{workspace.id}/settings/")
    form = page.locator("#llm-key-form")
    form.locator("select[name=provider]").select_option("openai_compatible")
    form.locator("input[name=name]").fill("scripted")
    form.locator("input[name=secret]").fill("sk-from-the-settings-page")
    form.locator("input[name=base_url]").fill(SCRIPTED_MODEL_URL)
    form.locator("input[name=model]").fill("scripted")
    form.locator("button").click()
    expect(page.locator("body")).to_contain_text("LLM key added.")
    screenshot(page, "agent-01-key-added")

    desktop = provision(lxc_api, "agent-e2e", profile="full")
    let_the_network_settle(page)
    words = [f"step{i}" for i in range(24)]
    scripted_model.script(
        ToolCall("exec", {"command": "echo from-the-chat > /home/agent/chat-proof.txt"}),
        Text(" ".join(words), pace=0.5),  # 12 s: time to see it half-written, even on a loaded machine
    )

    page.goto(f"{site}/desktops/{desktop.id}/")
    page.fill("#chat-text", "Crée chat-proof.txt puis raconte")
    page.click("#chat-form button")
    answer = page.locator("#chat-log li.agent").last
    # Streamed: the first words are on the page while the agent is still writing the rest.
    expect(answer).to_contain_text("step3", timeout=120000)
    reply = ChatMessage.objects.filter(desktop=desktop, author="agent").get()
    assert reply.status == "running" and "step23" not in answer.inner_text()
    # While it runs, the person may stop it.
    expect(answer.locator("button.stop-turn")).to_be_visible()
    screenshot(page, "agent-02-streaming")
    expect(answer).to_contain_text("step23", timeout=30000)
    expect(answer).not_to_have_class("pending", timeout=10000)
    # Once answered, there is nothing left to stop.
    expect(answer.locator("button.stop-turn")).to_have_count(0, timeout=10000)
    assert answer.inner_text().strip() == " ".join(words)
    screenshot(page, "agent-03-answered")
    assert run(desktop, "cat ~/chat-proof.txt").strip() == "from-the-chat"
    assert scripted_model.requests[0]["headers"]["authorization"] == "Bearer sk-from-the-settings-page"

    # What it cost shows in the desktop's details.
    page.reload()
    page.click("[data-tab=details-panel]")
    expect(page.locator("#details-panel")).to_contain_text("2 requests over 1 answers")
    deadline = time.monotonic() + 5
    while ChatMessage.objects.get(id=reply.id).status != "done":
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_a_refused_key_is_said_in_words_with_the_fix_one_click_away(
    page, site, lxc_api, workspace, scripted_model
):
    """The provider (the scripted model) answers 401 to the workspace's key, as a real one does to a
    wrong or revoked key."""
    scripted_model.accepted_keys = {"sk-the-right-one-1234"}
    admin = MembershipFactory(workspace=workspace, role=Role.ADMIN)
    services.llm_key_save(
        actor=Actor(user=admin.user),
        workspace_id=workspace.id,
        provider="openai_compatible",
        name="scripted",
        secret="sk-a-wrong-one-5678",
        base_url=SCRIPTED_MODEL_URL,
        model="scripted",
    )
    desktop = provision(lxc_api, "refused-key", profile="full")
    log_in(page, site, admin.user.email)
    let_the_network_settle(page)

    page.goto(f"{site}/desktops/{desktop.id}/")
    page.fill("#chat-text", "Range le bureau")
    page.click("#chat-form button")
    failed = page.locator("#chat-log li.agent.error")
    expect(failed).to_contain_text("refused this workspace's LLM key", timeout=120000)
    expect(failed.locator("details")).to_contain_text("401")  # the runtime's own words, folded
    screenshot(page, "agent-04-refused-key")
    assert scripted_model.requests[-1]["headers"]["authorization"] == "Bearer sk-a-wrong-one-5678"

    # The list says it too, and the fix is one click away from either page.
    page.goto(f"{site}/w/{workspace.id}/desktops/")
    row = page.locator(f"tr[data-desktop='{desktop.id}']")
    expect(row.locator("[data-field=outcome]")).to_contain_text("refused this workspace's LLM key")
    expect(page.locator("#fleet-summary [data-figure=in_error]")).to_have_text("1")
    screenshot(page, "agent-05-refused-key-in-the-list")
    page.goto(f"{site}/desktops/{desktop.id}/")
    failed.get_by_role("link", name="Open Settings").click()
    page.wait_for_url(f"{site}/w/{workspace.id}/settings/")
    expect(page.locator("#llm-key-form")).to_be_visible()
