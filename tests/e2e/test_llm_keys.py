"""A model key is checked when it is saved, and Settings says what its provider answered, in real
Chromium: asked from a real LXC desktop of the workspace (its network, its firewall), of the scripted
model server (a double: no LLM is reachable here), which refuses a wrong key with 401 as a real one does."""

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from playwright.sync_api import expect

from desktops import services
from desktops.audit import Actor
from desktops.models import LLMKey, Role
from tests.conftest import LXC_IMAGE, LXC_TEST_SETTINGS, SCRIPTED_MODEL_URL
from tests.e2e.conftest import log_in, screenshot
from tests.factories import MembershipFactory
from tests.support.desktops import provision
from workers.drivers.lxc import network as lxc_net

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.e2e,
    pytest.mark.lxc,
    pytest.mark.skipif(not LXC_IMAGE.is_file(), reason="no minimal golden image (make setup builds it)"),
]


def verdict_shown(page, url: str, verdict: str) -> None:
    """Reload Settings until the key's row shows the provider's answer (the check runs on a worker)."""
    deadline = time.monotonic() + 60
    while page.locator(f"#llm-keys [data-verdict={verdict}]").count() == 0:
        assert time.monotonic() < deadline, (
            f"the key never showed {verdict}: {LLMKey.objects.get().verdict!r}"
        )
        page.wait_for_timeout(500)
        page.goto(url)


def test_a_key_is_checked_when_saved_and_settings_say_so(page, site, lxc_api, workspace, scripted_model):
    scripted_model.accepted_keys = {"sk-the-right-one-1234"}
    provision(lxc_api, "key-checker")
    admin = MembershipFactory(workspace=workspace, role=Role.ADMIN)
    log_in(page, site, admin.user.email)
    settings = f"{site}/w/{workspace.id}/settings/"
    page.goto(settings)
    form = page.locator("#llm-key-form")
    form.locator("select[name=provider]").select_option("openai_compatible")
    form.locator("input[name=name]").fill("scripted")
    form.locator("input[name=secret]").fill("sk-a-wrong-one-5678")
    form.locator("input[name=base_url]").fill(SCRIPTED_MODEL_URL)
    form.locator("input[name=model]").fill("scripted")
    form.locator("button").click()
    expect(page.locator(".messages")).to_contain_text("Its provider is being asked")
    # The answer comes while the page stays open: a toast says it, without a reload.
    toast = page.locator("#toasts .toast.error")
    expect(toast).to_contain_text("LLM key scripted: its provider refuses it", timeout=60000)
    screenshot(page, "keys-00-refused-toast")

    verdict_shown(page, settings, "refused")
    expect(page.locator("#llm-keys")).to_contain_text("wrong, revoked or expired")
    screenshot(page, "keys-01-refused")
    asked = scripted_model.requests[-1]
    assert asked["path"] == "/v1/models" and asked["headers"]["authorization"] == "Bearer sk-a-wrong-one-5678"

    page.locator("#llm-keys input[name=secret]").fill("sk-the-right-one-1234")
    page.locator("#llm-keys button", has_text="Rotate").click()
    verdict_shown(page, settings, "accepted")
    screenshot(page, "keys-02-accepted")
    assert scripted_model.requests[-1]["headers"]["authorization"] == "Bearer sk-the-right-one-1234"


def test_a_key_check_cannot_be_aimed_at_the_hosts_own_services(lxc_api, workspace, members, lxc_test_engine):
    """An admin who sets a key's address to a service of the host gets "unreachable": the check goes out
    from the desktop, whose firewall keeps the host (and every private range) out of its reach."""
    hits = []

    class Recorder(BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    host = lxc_net.gateway_of(LXC_TEST_SETTINGS["LXC_SUBNET"])
    server = ThreadingHTTPServer(("0.0.0.0", 0), Recorder)  # noqa: S104 (every interface: the bridge's too)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        provision(lxc_api, "key-prober")
        key = services.llm_key_save(
            actor=Actor(user=members[Role.ADMIN].user),
            workspace_id=workspace.id,
            provider="openai_compatible",
            name="probe",
            secret="sk-probe-probe-1234",
            base_url=f"http://{host}:{server.server_address[1]}/v1",
            model="any",
        )
        deadline = time.monotonic() + 60
        while (verdict := LLMKey.objects.get(id=key.id).verdict) == "":
            assert time.monotonic() < deadline, "the key was never checked"
            time.sleep(0.5)
        assert verdict == "unreachable" and hits == []
    finally:
        server.shutdown()
        server.server_close()
