"""Egress policies set through the API, enforced with real packets in real desktops by the worker."""

import time

import paramiko
from django.test import Client

from desktops import alerts
from desktops.guest import desktop_ssh_connect
from desktops.models import Desktop, Role
from tests.conftest import LXC_DESKTOP_TESTS, client_for
from tests.factories import api_key_for
from tests.support.desktops import provision
from tests.support.internet import ALLOWED, BLOCKED

pytestmark = LXC_DESKTOP_TESTS

FETCH = (
    'python3 -c "import sys, urllib.request; '
    'print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode())" {}'
)


def fetch(desktop: Desktop, url: str) -> str | None:
    """What the desktop's agent gets from the URL, or None when it cannot reach it."""
    # A desktop that has just come up may turn away a first SSH log-in while its sshd settles.
    attempts = 3
    while True:
        try:
            with desktop_ssh_connect(desktop_id=desktop.id, host=desktop.private_ip, username="agent") as ssh:
                _, out, _ = ssh.exec_command(FETCH.format(url), timeout=30)
                return out.read().decode().strip() if out.channel.recv_exit_status() == 0 else None
        except paramiko.SSHException:
            attempts -= 1
            if not attempts:
                raise
            time.sleep(1)


def within(seconds: float, check) -> float:
    """How long until ``check()`` holds; an assertion error if it does not within ``seconds``."""
    start = time.monotonic()
    while not check():
        assert time.monotonic() - start < seconds, f"not within {seconds} s"
        time.sleep(0.2)
    return time.monotonic() - start


def test_a_policy_set_in_the_api_holds_in_a_running_desktop_within_seconds(
    lxc_api, members, workspace, internet
):
    admin = client_for(key=api_key_for(members[Role.ADMIN]))
    allowlist = {"mode": "allowlist", "entries": ["allowed.test"]}
    assert admin.put(f"/api/workspaces/{workspace.id}/egress", allowlist, format="json").status_code == 200
    desktop = provision(lxc_api, "fenced")

    assert fetch(desktop, "http://allowed.test/") == f"stand-in {ALLOWED}"
    assert fetch(desktop, "http://blocked.test/") is None
    assert fetch(desktop, f"http://{BLOCKED}/") is None
    # Counted, and shown on the desktop's page.
    viewer = Client()
    viewer.force_login(members[Role.VIEWER].user)
    page = viewer.get(f"/desktops/{desktop.id}/").content.decode()
    assert "<code>blocked.test</code>" in page.split('id="blocked-names"')[1].split("</table>")[0]
    assert f"<code>{BLOCKED}</code>" in page.split('id="blocked-egress"')[1].split("</table>")[0]
    # Counted by destination from the engine's counters, in the API; a burst of them raises an alert.
    burst = {"alertThresholds": {"blockedPerMinute": 1}}
    assert admin.patch(f"/api/workspaces/{workspace.id}", burst, format="json").status_code == 200
    assert alerts.alerts_evaluate() == {}  # a first reading: nothing to make a rate of yet

    def counted():
        found = client_for(key=api_key_for(members[Role.VIEWER])).get(f"/api/desktops/{desktop.id}/blocked")
        return {(b["via"], b["destination"]): b["attempts"] for b in found.json()["results"]}

    before = counted()
    assert before[("name", "blocked.test")] >= 1 and before[("address", BLOCKED)] >= 1
    assert ("address", ALLOWED) not in before
    assert fetch(desktop, f"http://{BLOCKED}/") is None
    assert alerts.alerts_evaluate() == {"egress": 1}
    assert counted()[("address", BLOCKED)] > before[("address", BLOCKED)]

    # Open, for the workspace: the running desktop follows, without a restart.
    assert (
        admin.put(f"/api/workspaces/{workspace.id}/egress", {"mode": "open"}, format="json").status_code
        == 200
    )
    within(10, lambda: fetch(desktop, f"http://{BLOCKED}/") == f"stand-in {BLOCKED}")
    assert fetch(desktop, "http://blocked.test/") == f"stand-in {BLOCKED}"

    # Deny-all, for this desktop alone.
    assert admin.put(f"/api/desktops/{desktop.id}/egress", {"mode": "deny"}, format="json").status_code == 200
    within(10, lambda: fetch(desktop, "http://allowed.test/") is None)
    assert fetch(desktop, f"http://{BLOCKED}/") is None
    assert fetch(desktop, f"http://{ALLOWED}/") is None

    # Following its workspace's open policy again.
    assert admin.delete(f"/api/desktops/{desktop.id}/egress").json()["mode"] == "open"
    within(10, lambda: fetch(desktop, "http://blocked.test/") == f"stand-in {BLOCKED}")
    assert Desktop.objects.get(id=desktop.id).state == "running"
