"""The web side of the trust boundary, each attack tried and failing: guessing the admin's password,
starting a deployment insecure, reading a workspace's live stream after leaving it, smuggling a
formula into a spreadsheet, the switcher answering 500, a body too large for memory."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests
from django.test import Client

from desktops import services
from desktops.audit import Actor, audit_record
from desktops.events import DesktopStateChanged, publish_state_change
from desktops.middleware import RequestContext, current_request
from desktops.models import Role
from missioncontrol.streams import RECHECK_SECONDS
from tests.conftest import ROOT, guest_server, web_server
from tests.factories import PASSWORD, DesktopFactory, MembershipFactory, UserFactory
from tests.support.services import held_in_temporary_files, peak_memory, server_pid

pytestmark = pytest.mark.django_db


def test_the_admins_sign_in_is_mission_controls_own_which_limits_failed_attempts(client, settings):
    """/admin/login/ once answered 23 wrong passwords in a row, all 200."""
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
    staff = UserFactory(is_staff=True, is_superuser=True)
    tried = client.post("/admin/login/", {"username": staff.username, "password": "guess"})
    assert tried.status_code == 302 and tried.url.startswith("/accounts/login/")
    for i in range(6):
        client.post("/accounts/login/", {"login": staff.email, "password": f"guess-{i}"})
    # Past the limit, even the right password is turned away for a while.
    right = client.post("/accounts/login/", {"login": staff.email, "password": PASSWORD})
    assert right.status_code == 200 and "Too many failed login attempts" in right.content.decode()
    assert client.get("/admin/").status_code == 302, "signed in past the limit"


def start_up(**environment) -> subprocess.CompletedProcess:
    """Load the settings as a deployment would, with this environment (and no .env of its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "SITE_URL", "SECRET_KEY"))}
    env.update(environment)
    code = "import lebureau.settings as s; print(s.SESSION_COOKIE_SECURE, s.SECURE_HSTS_SECONDS)"
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


GOOD_KEY = "k" + "x7Q2-pL9_mZ4vB8nR1tW6yU3oI5aS0dF" * 2


@pytest.mark.parametrize(
    ("environment", "refusal"),
    [
        (
            {"DJANGO_DEBUG": "true", "SITE_URL": "https://bureau.example.com", "SECRET_KEY": GOOD_KEY},
            "development",
        ),
        ({"DJANGO_DEBUG": "false", "SITE_URL": "https://bureau.example.com", "SECRET_KEY": "short"}, "weak"),
        ({"DJANGO_DEBUG": "false", "SITE_URL": "http://bureau.example.com", "SECRET_KEY": GOOD_KEY}, "https"),
    ],
)
def test_a_deployment_does_not_start_insecure_by_accident(environment, refusal):
    result = start_up(**environment)
    assert result.returncode != 0 and "ImproperlyConfigured" in result.stderr and refusal in result.stderr


def test_a_deployment_on_https_gets_secure_cookies_and_hsts():
    result = start_up(DJANGO_DEBUG="false", SITE_URL="https://bureau.example.com", SECRET_KEY=GOOD_KEY)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", str(365 * 24 * 3600)]


def test_pages_carry_a_content_security_policy(client):
    policy = client.get("/accounts/login/")["Content-Security-Policy"]
    assert (
        "script-src 'self'" in policy
        and "frame-ancestors 'none'" in policy
        and "unsafe-inline" not in policy.split("style-src")[0]
    )


def test_the_workspace_switcher_refuses_a_workspace_that_is_not_yours(client, members, workspace):
    client.force_login(members[Role.MEMBER].user)
    other = members["outsider"].workspace
    for wanted in (other.id, "", "nonsense"):
        response = client.get(f"/switch/?workspace={wanted}")
        assert response.status_code == 302 and response.url == "/", wanted
    assert client.get(f"/switch/?workspace={workspace.id}").url == f"/w/{workspace.id}/desktops/"


@pytest.mark.parametrize("request_id", ["=cmd|' /C calc'!A0", "x;=cmd|' /C calc'!A0"])
def test_exported_audit_cells_cannot_run_as_formulas(client, members, workspace, request_id):
    # The request id is anyone's to set (X-Request-ID); the second splits into `=cmd…` where ';' separates.
    token = current_request.set(RequestContext(request_id, None))
    try:
        audit_record(actor=Actor(system="x"), workspace_id=workspace.id, action="desktop.create")
    finally:
        current_request.reset(token)
    client.force_login(members[Role.ADMIN].user)
    response = client.get(f"/w/{workspace.id}/audit/?format=csv")
    body = b"".join(response.streaming_content).decode()
    # Split as a ';'-separated spreadsheet would: no cell starts with the formula.
    cells = [cell for line in body.splitlines() for part in line.split(",") for cell in part.split(";")]
    assert "'=cmd|' /C calc'!A0" in cells and not any(cell.startswith("=") for cell in cells)


class Stream:
    """A page's live event stream, read in a thread: what arrived, and whether the server ended it."""

    def __init__(self, url: str, session_cookie: str):
        self.events: list[dict] = []
        self.ended = threading.Event()
        self.opened = threading.Event()
        self.response = requests.get(url, cookies={"sessionid": session_cookie}, stream=True, timeout=30)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        kind = ""
        try:
            for line in self.response.iter_lines(decode_unicode=True):
                if line.startswith("event: "):
                    kind = line.removeprefix("event: ")
                    if kind == "stream-open":
                        self.opened.set()
                elif line.startswith("data: {") and kind in ("desktop", "chat"):
                    self.events.append(json.loads(line.removeprefix("data: ")))
        except Exception:  # noqa: S110 (the test closing the response ends the read, however the HTTP stack says so)
            pass
        self.ended.set()


def remove_with_the_service(owner, leaving):
    services.membership_remove(
        actor=Actor(user=owner.user), workspace_id=leaving.workspace_id, membership_id=leaving.id
    )


def delete_the_account(owner, leaving):
    leaving.user.delete()  # the admin's usual offboarding


def delete_the_membership_row(owner, leaving):
    leaving.delete()  # as the admin's change list does it


@pytest.mark.parametrize("offboard", [remove_with_the_service, delete_the_account, delete_the_membership_row])
@pytest.mark.django_db(transaction=True)
def test_a_removed_members_open_stream_is_cut_at_once(
    driver_dir, tmp_path_factory, workspace, plan, offboard
):
    """A removed member's open page used to keep receiving the workspace's events (answers included),
    and still did when the account or the membership was deleted rather than removed."""
    owner = MembershipFactory(workspace=workspace, role=Role.OWNER)
    leaving = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    staying = MembershipFactory(workspace=workspace, role=Role.VIEWER)
    desktop = DesktopFactory(workspace=workspace)
    with web_server(driver_dir, tmp_path_factory.getbasetemp()) as site:
        streams = {}
        for name, membership in (("leaving", leaving), ("staying", staying)):
            browser = Client()
            browser.force_login(membership.user)
            streams[name] = Stream(f"{site}/events/w/{workspace.id}/", browser.cookies["sessionid"].value)
            assert streams[name].opened.wait(10)
        offboard(owner, leaving)
        assert streams["leaving"].ended.wait(5), "the removed member's stream stayed open"
        publish_state_change(DesktopStateChanged.of(desktop))
        deadline = time.monotonic() + 5
        while not streams["staying"].events and time.monotonic() < deadline:
            time.sleep(0.1)
        assert streams["staying"].events, "the member who stays still gets events"
        assert streams["leaving"].events == []
        for stream in streams.values():
            stream.response.close()


@pytest.mark.django_db(transaction=True)
def test_a_new_password_ends_the_streams_of_the_old_sessions(driver_dir, tmp_path_factory, workspace, plan):
    """The old password may be what leaked: a page opened with it used to go on receiving the events."""
    member = MembershipFactory(workspace=workspace, role=Role.MEMBER)
    browser = Client()
    browser.force_login(member.user)
    cookie = browser.cookies["sessionid"].value
    with web_server(driver_dir, tmp_path_factory.getbasetemp()) as site:
        url = f"{site}/events/w/{workspace.id}/"
        stream = Stream(url, cookie)
        assert stream.opened.wait(10)
        member.user.set_password("a-new-password-nobody-has-seen")
        member.user.save()
        assert stream.ended.wait(5), "the stream of the old session stayed open"
        time.sleep(RECHECK_SECONDS)  # past the moment every stream of theirs is refused
        again = Stream(url, cookie)
        assert not again.opened.wait(3), "the old session opened the stream again"
        browser.force_login(member.user)  # signed in again: with the new password's session
        anew = Stream(url, browser.cookies["sessionid"].value)
        assert anew.opened.wait(10), "a session of the new password could not open it"
        for each in (stream, again, anew):
            each.response.close()


# Larger than any limit of the listeners, and than what they may hold of a body in memory (1 MiB).
HUGE = 200 * 1024 * 1024
CHUNK = 1024 * 1024
MIB = 1024 * 1024


class Watch:
    """The most the listener holds in temporary files while a request runs, sampled every 20 ms."""

    def __init__(self, port: int):
        self.pid, self.most, self.done = server_pid(port), 0, threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self.done.wait(0.02):
            self.most = max(self.most, held_in_temporary_files(self.pid))

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.done.set()
        self.thread.join()


def _zeros(total: int):
    """A body without a length (sent chunked), made as it is sent."""
    for _ in range(total // CHUNK):
        yield bytes(CHUNK)


@pytest.mark.parametrize("chunked", [False, True], ids=["sized", "chunked"])
@pytest.mark.parametrize(
    ("listener", "path"),
    [(web_server, "/api/desktops/dsk_anyone/files?path=big"), (guest_server, "/v1/approvals")],
)
@pytest.mark.django_db(transaction=True)
def test_an_anonymous_body_larger_than_any_limit_costs_the_listeners_neither_memory_nor_disk(
    driver_dir, tmp_path_factory, tmp_path, listener, path, chunked
):
    """Daphne read a whole body into its memory before any check: one anonymous PUT of 8 GiB was 8 GiB
    of the web server's, or the guest endpoint's; and before daphne, Twisted wrote all of it to a
    temporary file (200 MiB of disk for this one)."""
    body = tmp_path / "huge"
    with body.open("wb") as f:
        f.truncate(HUGE)  # sparse: sent whole (with its Content-Length), stored nowhere
    with listener(driver_dir, tmp_path_factory.getbasetemp()) as site:
        port = int(site.rsplit(":", 1)[1])
        assert requests.get(f"{site}/", timeout=10).status_code < 500
        before = peak_memory(port)
        with body.open("rb") as data, Watch(port) as disk:
            sent = _zeros(HUGE) if chunked else data
            answer = requests.put(f"{site}{path}", data=sent, headers={"Accept-Language": "fr"}, timeout=120)
        assert answer.status_code == 401, answer.text
        # Refused by the server itself, from its headers (in the asker's language).
        assert answer.json()["error"]["code"] == "not_authenticated", answer.text
        assert "identifiants" in answer.json()["error"]["message"], answer.text
        grown = peak_memory(port) - before
    assert grown < 32 * MIB, f"the listener's peak grew by {grown >> 20} MiB for a {HUGE >> 20} MiB body"
    assert disk.most < MIB, f"the listener held {disk.most >> 20} MiB of it on disk"


@pytest.mark.django_db(transaction=True)
def test_bodies_with_credentials_are_bounded_alone_and_together(driver_dir, tmp_path_factory):
    """A key (even a made-up one) let any body through to the disk: larger than any endpoint takes, and
    as many at once as the disk holds."""
    limits = {"WEB_MAX_BODY_MIB": "16", "WEB_BODIES_ON_DISK_MIB": "8"}
    keyed = {"Authorization": "Bearer lb_made_up"}
    with web_server(driver_dir, tmp_path_factory.getbasetemp(), **limits) as site:
        url = f"{site}/api/desktops/dsk_anyone/files?path=big"
        too_large = requests.put(url, data=bytes(17 * MIB), headers=keyed, timeout=60)
        assert too_large.status_code == 413 and too_large.json()["error"]["code"] == "too_large"
        # One request that announces 6 MiB and holds: its body is counted from its headers.
        host, port = site.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port))) as held:
            held.sendall(
                f"PUT /api/desktops/dsk_anyone/files?path=big HTTP/1.1\r\nHost: {host}\r\n"
                f"Authorization: Bearer lb_made_up\r\nContent-Length: {6 * MIB}\r\n\r\n".encode()
                + bytes(MIB)
            )
            time.sleep(0.5)
            busy = requests.put(url, data=bytes(6 * MIB), headers=keyed, timeout=60)
            assert busy.status_code == 503 and busy.headers["Retry-After"] == "30", busy.text
        time.sleep(0.5)  # the held one gone, its share is free again: the app answers the made-up key
        admitted = requests.put(url, data=bytes(6 * MIB), headers=keyed, timeout=60)
        assert admitted.status_code == 401 and admitted.json()["error"]["code"] != "not_authenticated"
