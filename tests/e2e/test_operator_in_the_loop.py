"""The operator in the loop, in real Chromium on a real LXC desktop: a long turn stopped with the viewer's
Stop button, its processes gone from the desktop; then the agent asks for approval from inside the
desktop, the request appears live on the viewer, and the operator's answer reaches the agent.

The model is the scripted OpenAI-compatible server (a double: no LLM is reachable here).
"""

import pytest
from playwright.sync_api import expect

from desktops.models import ChatMessage, Role
from tests.conftest import LXC_IMAGE
from tests.e2e.conftest import let_the_network_settle, log_in, screenshot
from tests.factories import MembershipFactory
from tests.support.agent_loop import Asking, install_agent, turn_processes, wait_for
from tests.support.desktops import provision
from tests.support.scripted_model import Text

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.e2e,
    pytest.mark.lxc,
    pytest.mark.skipif(not LXC_IMAGE.is_file(), reason="no golden image (make setup builds it)"),
]


def test_a_turn_is_stopped_and_a_request_approved_from_the_viewer(
    page, site, lxc_api, workspace, scripted_model, guest_endpoint
):
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    log_in(page, site, member.user.email)
    desktop = provision(lxc_api, "in-the-loop")
    install_agent(desktop, workspace)
    scripted_model.script(Text(" ".join(f"mot{i}" for i in range(400)), pace=0.2))
    let_the_network_settle(page)

    page.goto(f"{site}/desktops/{desktop.id}/")
    page.fill("#chat-text", "Write a very long answer")
    page.click("#chat-form button")
    answer = page.locator("#chat-log li.agent").last
    expect(answer).to_contain_text("mot3", timeout=60000)
    screenshot(page, "loop-01-turn-running")
    answer.locator("button.stop-turn").click()
    expect(answer).to_have_class("agent cancelled", timeout=15000)
    reply = ChatMessage.objects.get(desktop=desktop, author="agent")
    assert reply.status == "cancelled"
    wait_for(lambda: turn_processes(desktop, reply.id) == "", "the turn's processes live on", timeout=30)
    screenshot(page, "loop-02-turn-stopped")

    page.click("[data-tab=approvals-panel]")
    asking = Asking(desktop, "--title 'Déployer en prod' --details - --timeout 5m", stdin="make deploy")
    request = page.locator("#approvals-panel li.approval.pending")
    expect(request).to_contain_text("Déployer en prod", timeout=15000)
    expect(request).to_contain_text("make deploy")
    screenshot(page, "loop-03-approval-asked")
    request.locator("input[name=comment]").fill("Vas-y, c'est validé.")
    request.locator("button[value=approve]").click()
    assert asking.result() == (0, "Vas-y, c'est validé.\n")
    expect(page.locator("#approvals-panel")).to_contain_text("No request waiting.")
    screenshot(page, "loop-04-approved")
