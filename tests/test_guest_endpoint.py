"""The guest endpoint, the one door from a desktop to the control plane, served by its own listener (real
Daphne running `lebureau.guest_asgi`): each attack tried and failing. It serves nothing but the guest
URLs, takes nothing but a live desktop's own token, and a desktop acts on itself alone."""

import base64
import io
import json
import os
import secrets
import subprocess
import sys
import time

import pytest
import requests
from django.conf import settings
from PIL import Image, ImageChops

from desktops import approvals
from desktops.audit import Actor
from desktops.crypto import api_token_hash
from desktops.guest import vnc_password_file
from desktops.models import AuditEvent, Desktop, Role
from tests.conftest import ROOT, api_key_for, guest_server
from tests.factories import DesktopFactory
from tests.support import services as real
from tests.support.services import free_port, port_open

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def guest(django_db_setup, driver_dir, tmp_path_factory):
    with guest_server(driver_dir, tmp_path_factory.getbasetemp()) as url:
        yield url


def desktop_with_token(**fields):
    token = secrets.token_urlsafe(32)
    return DesktopFactory(state="running", agent_token_hash=api_token_hash(token), **fields), token


def call(guest, path: str, token: str | None = None, method: str = "GET", **kwargs) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return requests.request(method, f"{guest}{path}", headers=headers, timeout=10, **kwargs)


def test_a_desktop_is_known_by_its_own_token_and_nothing_else(guest, members, owner_key):
    desktop, token = desktop_with_token(workspace=members[Role.OWNER].workspace)
    me = call(guest, "/v1/desktop", token)
    assert me.status_code == 200, me.text
    assert me.json()["id"] == desktop.id
    for wrong in (None, "guess", owner_key, token + "x"):
        refused = call(guest, "/v1/desktop", wrong)
        assert refused.status_code in (401, 403), (wrong, refused.text)
        assert "error" in refused.json()


def test_the_guest_listener_serves_no_page_no_api_and_no_admin(guest, members, owner_key):
    """It once ran Mission Control's whole middleware: its static files were served to desktops, and a
    session cookie was read."""
    _, token = desktop_with_token(workspace=members[Role.OWNER].workspace)
    paths = ("/", "/api/desktops", "/api/schema/", "/admin/", "/accounts/login/", "/events/w/x/")
    for path in (*paths, "/static/app.js", "/static/admin/css/base.css"):
        for credential in (owner_key, token):
            response = call(guest, path, credential, cookies={"sessionid": "stolen", "csrftoken": "x"})
            assert response.status_code == 404, (path, response.status_code, response.text[:200])
            assert "Set-Cookie" not in response.headers and "Cookie" not in response.headers.get("Vary", "")


# An address of an interface the test makes, after the listener started.
LATE_ADDRESS, LATE_INTERFACE = "10.215.99.1", "lbguesttest0"


def test_the_guest_listener_is_on_its_own_address_alone_even_before_that_exists(driver_dir, tmp_path_factory):
    """It listened on every interface, as the desktops' bridge it serves may not exist when it starts: a
    neighbour reached it through any other."""
    basetemp, port = tmp_path_factory.getbasetemp(), free_port()
    log = basetemp / f"guest-{port}.log"

    def listening():
        return log.exists() and f"Listening on TCP address {LATE_ADDRESS}:{port}" in log.read_text()

    try:
        with guest_server(driver_dir, basetemp, LATE_ADDRESS, port, ready=listening):
            assert not port_open(port, "127.0.0.1")  # nor on any other address of the host's
            for command in (
                ["link", "add", LATE_INTERFACE, "type", "bridge"],
                ["addr", "add", f"{LATE_ADDRESS}/32", "dev", LATE_INTERFACE],
                ["link", "set", LATE_INTERFACE, "up"],
            ):
                subprocess.run(["ip", *command], check=True)
            answer = requests.get(f"http://{LATE_ADDRESS}:{port}/v1/desktop", timeout=10)
            assert answer.status_code == 401, answer.text
    finally:
        subprocess.run(["ip", "link", "del", LATE_INTERFACE], check=False, capture_output=True)


def test_one_desktops_token_cannot_touch_anothers_requests(guest, members):
    mine, my_token = desktop_with_token(workspace=members[Role.OWNER].workspace)
    theirs, _ = desktop_with_token()
    asked = approvals.approval_request(desktop=theirs, title="Déployer en prod")
    peek = call(guest, f"/v1/approvals/{asked.id}", my_token)
    assert peek.status_code == 404, peek.text
    # What a desktop asks is its own, whatever it claims in the body.
    claim = {"title": "Pour l'autre", "desktop": theirs.id}
    made = call(guest, "/v1/approvals", my_token, "POST", json=claim)
    assert made.status_code == 201, made.text
    assert approvals.Approval.objects.get(id=made.json()["id"]).desktop_id == mine.id


def test_a_destroyed_desktops_token_is_void(guest, members):
    desktop, token = desktop_with_token(workspace=members[Role.OWNER].workspace)
    assert call(guest, "/v1/desktop", token).status_code == 200
    desktop.state = "destroyed"
    desktop.save()
    assert call(guest, "/v1/desktop", token).status_code == 401


def test_a_request_is_checked_before_it_is_kept(guest, members):
    desktop, token = desktop_with_token(workspace=members[Role.OWNER].workspace)
    for body in ({"title": ""}, {"title": "x" * 201}, {"title": "ok", "timeout": 0}, {"details": "no title"}):
        refused = call(guest, "/v1/approvals", token, "POST", json=body)
        assert refused.status_code == 400, (body, refused.text)
    assert not desktop.approvals.exists()


SPOOFS = {
    # Shown right to left from U+202E on: the approver reads "Lire rapport.txt", the agent runs an .exe.
    "a bidi override in the title": {"title": "Lire \u202etxt.exe", "details": ""},
    # A zero-width space: `rm -rf /\u200b tmp` reads as one path and is another command.
    "a zero-width space in the details": {"title": "Nettoyer", "details": "rm -rf /\u200b tmp"},
    "an escape sequence in the details": {"title": "Nettoyer", "details": "ls\x1b[2K\rrm -rf ~"},
    # Shown cut at 1,000 characters while the digest binds the whole.
    "a working directory longer than shown": {"title": "ok", "cwd": "/srv/" + "a" * 1000},
}


@pytest.mark.parametrize("body", SPOOFS.values(), ids=SPOOFS.keys())
def test_a_request_that_would_read_otherwise_than_it_is_refused(guest, members, body):
    desktop, token = desktop_with_token(workspace=members[Role.OWNER].workspace)
    refused = call(guest, "/v1/approvals", token, "POST", json=body)
    assert refused.status_code == 400, refused.text
    field = {"title", "details", "cwd"} & set(refused.json()["error"]["fields"])
    assert field and not desktop.approvals.exists()


def test_an_operators_api_key_is_no_desktop_token(guest, members):
    key = api_key_for(members[Role.OWNER])
    assert call(guest, "/v1/approvals", key, "POST", json={"title": "x"}).status_code == 401


def test_a_runaway_agent_cannot_flood_its_operators(guest, members):
    desktop, token = desktop_with_token(workspace=members[Role.OWNER].workspace)
    for i in range(approvals.MAX_PENDING):
        assert call(guest, "/v1/approvals", token, "POST", json={"title": f"n°{i}"}).status_code == 201
    refused = call(guest, "/v1/approvals", token, "POST", json={"title": "un de trop"})
    assert refused.status_code == 409, refused.text
    assert desktop.approvals.count() == approvals.MAX_PENDING


def test_requests_that_expire_at_once_still_count_against_the_desktops_rate(guest, members):
    # A second's wait each: none stays pending long enough to meet MAX_PENDING, all are counted.
    _desktop, token = desktop_with_token(workspace=members[Role.OWNER].workspace)
    rate = int(settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["approvals"].split("/")[0])
    for i in range(rate):
        asked = call(guest, "/v1/approvals", token, "POST", json={"title": f"n°{i}", "timeout": 1})
        assert asked.status_code in (201, 409), asked.text
    refused = call(guest, "/v1/approvals", token, "POST", json={"title": "encore", "timeout": 1})
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    # Another desktop has its own count.
    _other, other_token = desktop_with_token(workspace=members[Role.OWNER].workspace)
    assert call(guest, "/v1/approvals", other_token, "POST", json={"title": "moi"}).status_code == 201


def test_a_body_too_large_is_refused_unread(guest, members):
    desktop, token = desktop_with_token(workspace=members[Role.OWNER].workspace)
    huge = {"title": "gros", "details": "x" * 300_000}
    assert call(guest, "/v1/approvals", token, "POST", json=huge).status_code == 413
    assert not desktop.approvals.exists()


def bureau_approve(guest, tmp_path, desktop, token, *arguments) -> subprocess.Popen:
    """The desktop's `bureau approve`, run here against the real guest endpoint, with its files."""
    config = tmp_path / "bureau"
    config.mkdir(exist_ok=True)
    for name, value in (("guest_url", guest), ("token", token), ("desktop_id", desktop.id)):
        (config / name).write_text(value + "\n")
    helper = ROOT / "image-build" / "guest" / "bureau"
    env = {**os.environ, "BUREAU_CONFIG_DIR": str(config)}
    return subprocess.Popen(
        [sys.executable, str(helper), "approve", *arguments], env=env, stdout=subprocess.PIPE, text=True
    )


def waiting(desktop) -> approvals.Approval:
    deadline = time.monotonic() + 20
    while (found := desktop.approvals.filter(status="pending").first()) is None:
        assert time.monotonic() < deadline, "no request arrived"
        time.sleep(0.1)
    return found


def test_a_decision_counts_only_for_exactly_what_was_asked(guest, members, tmp_path):
    desktop, token = desktop_with_token(workspace=members[Role.OWNER].workspace)
    owner = Actor(user=members[Role.OWNER].user)
    asking = bureau_approve(guest, tmp_path, desktop, token, "--title", "Payer la facture n°42 — 1 200 €")
    asked = waiting(desktop)
    approvals.approval_decide(actor=owner, approval_id=asked.id, approve=True, comment="ok")
    assert asking.wait(20) == 0 and asking.stdout.read() == "ok\n"
    # A decision recorded for something else than what this agent asked does not let it go on.
    asking = bureau_approve(guest, tmp_path, desktop, token, "--title", "Payer la facture n°43")
    asked = waiting(desktop)
    approvals.Approval.objects.filter(id=asked.id).update(digest="0" * 64)
    approvals.approval_decide(actor=owner, approval_id=asked.id, approve=True)
    assert asking.wait(20) == 1


def test_a_desktop_reports_its_own_commands_and_no_other_desktops(guest, members):
    mine, my_token = desktop_with_token(workspace=members[Role.OWNER].workspace)
    theirs, their_token = desktop_with_token()
    # Whatever desktop the body names, the report counts for the token's own.
    made = call(guest, "/v1/activity", my_token, "POST", json={"commands": 7, "desktop": theirs.id})
    assert made.status_code == 204, made.text
    for wrong in (None, "guess", my_token + "x", api_key_for(members[Role.OWNER])):
        refused = call(guest, "/v1/activity", wrong, "POST", json={"commands": 1000})
        assert refused.status_code in (401, 403), (wrong, refused.text)
    for body in ({}, {"commands": 0}, {"commands": -5}, {"commands": 100_001}, {"commands": "many"}):
        assert call(guest, "/v1/activity", my_token, "POST", json=body).status_code == 400, body
    assert call(guest, "/v1/activity", their_token, "POST", json={"commands": 2}).status_code == 204
    mine.refresh_from_db()
    theirs.refresh_from_db()
    assert (mine.agent_commands, theirs.agent_commands) == (7, 2)
    theirs.state = "destroyed"
    theirs.save(update_fields=["state"])
    assert call(guest, "/v1/activity", their_token, "POST", json={"commands": 2}).status_code == 401


PLUGIN = ROOT / "desktops" / "agent_plugins" / "bureau-approvals" / "index.mjs"
# OpenClaw's side of the plugin, as far as the plugin sees it: it registers its hook, which is then
# called before every `exec` of the agent. The commands here are none the policy names.
OPENCLAW = """
const plugin = (await import(process.argv[1])).default;
let hook;
plugin.register({
  on: (name, handler, options) => {
    if (name === "before_tool_call" && options.matcher.includes("exec")) hook = handler;
  },
});
for (let i = 0; i < Number(process.argv[2]); i++) {
  if ((await hook({ params: { command: `echo ${i}` } }, { sessionKey: "agent:main:x" })) !== undefined) {
    process.exit(1);
  }
}
setTimeout(() => {}, 30_000); // the gateway lives on
"""


def test_openclaws_plugin_reports_the_agents_commands(guest, members, tmp_path):
    desktop, token = desktop_with_token(workspace=members[Role.OWNER].workspace)
    config, home = tmp_path / "bureau", tmp_path / "home"
    config.mkdir()
    (config / "guest_url").write_text(guest + "\n")
    (config / "token").write_text(token + "\n")
    policy = home / ".openclaw" / "bureau" / "approvals.json"
    policy.parent.mkdir(parents=True)
    policy.write_text(json.dumps({"commands": ["git push"], "timeout": 60}))
    env = {**os.environ, "HOME": str(home), "BUREAU_CONFIG_DIR": str(config)}
    gateway = subprocess.Popen(
        ["node", "--input-type=module", "-e", OPENCLAW, PLUGIN.as_uri(), "12"],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while (counted := Desktop.objects.get(id=desktop.id).agent_commands) < 12:
            assert gateway.poll() is None, gateway.stderr.read()
            assert time.monotonic() < deadline, f"{counted} commands reported"
            time.sleep(0.2)
        time.sleep(3)  # a report more would come by now
        assert Desktop.objects.get(id=desktop.id).agent_commands == 12
    finally:
        gateway.kill()
        gateway.wait()


# The desktop's own screen: a real Xvnc (an xterm on it) asking for this desktop's VNC passwords, which
# the guest endpoint reaches as it reaches a desktop's.
SCREEN_DESKTOP = "dsk_guestscreen0"
WIDTH, HEIGHT = 640, 400


@pytest.fixture(scope="module")
def screen_guest(django_db_setup, driver_dir, tmp_path_factory):
    passwords = tmp_path_factory.mktemp("vnc") / "passwd"
    passwords.write_bytes(vnc_password_file(SCREEN_DESKTOP))
    with real.xvnc(geometry=f"{WIDTH}x{HEIGHT}", password_file=passwords) as (_display, port):
        basetemp = tmp_path_factory.getbasetemp()
        with guest_server(driver_dir, basetemp, DESKTOP_VNC_PORT=str(port)) as url:
            yield url


@pytest.fixture
def screen_desktop(members):
    """A desktop whose screen is that Xvnc, and its token."""
    return desktop_with_token(
        id=SCREEN_DESKTOP, workspace=members[Role.OWNER].workspace, private_ip="127.0.0.1"
    )


def screenshot(guest, token, query: str = "") -> tuple[dict, Image.Image]:
    answer = call(guest, f"/v1/screen/screenshot{query}", token)
    assert answer.status_code == 200, answer.text
    shot = answer.json()
    return shot, Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")


def drawn(guest, token) -> Image.Image:
    """The screen once the xterm is on it (it maps a moment after the server starts)."""
    deadline = time.monotonic() + 10
    while True:
        image = screenshot(guest, token)[1]
        colours = image.getcolors(maxcolors=1 << 24)
        if max(count for count, _ in colours) < WIDTH * HEIGHT * 0.95 or time.monotonic() > deadline:
            return image
        time.sleep(0.2)


def test_a_desktops_agent_sees_and_acts_on_its_own_screen_and_is_audited(
    screen_guest, screen_desktop, members
):
    desktop, token = screen_desktop
    theirs, _ = desktop_with_token(private_ip="127.0.0.1")
    before = drawn(screen_guest, token)
    # The API's screenshot, in JSON: scaled down, with what maps its points back to the screen.
    shot, image = screenshot(screen_guest, token, f"?width=320&desktop={theirs.id}")
    assert (shot["width"], shot["height"], shot["scale"]) == (320, 200, 0.5) and image.size == (320, 200)
    assert (shot["screenWidth"], shot["screenHeight"], shot["contentType"]) == (WIDTH, HEIGHT, "image/png")

    # The API's batch of actions, on the token's own desktop whatever the body names.
    batch = {
        "desktop": theirs.id,
        "actions": [{"type": "move", "x": 100, "y": 40}, {"type": "type", "text": "echo l'agent était là"}],
        "screenshot": True,
    }
    done = call(screen_guest, "/v1/screen/actions", token, "POST", json=batch)
    assert done.status_code == 200, done.text
    assert done.json()["count"] == 2 and done.json()["screenshot"]["width"] == WIDTH
    after = Image.open(io.BytesIO(base64.b64decode(done.json()["screenshot"]["data"]))).convert("RGB")
    assert ImageChops.difference(before, after).getbbox() is not None, "the typed text is not on the screen"
    # Audited as an operator's batch is, with the desktop (its agent) as the actor; nothing on theirs.
    event = AuditEvent.objects.get(action="desktop.screen.actions")
    assert (event.actor, event.target, event.workspace_id) == (
        f"system:desktop:{desktop.id}",
        desktop.id,
        desktop.workspace_id,
    )
    assert event.detail == {"count": 2, "types": ["move", "type"], "typed": 21}
    # The prompt emptied for the next test.
    clear = {"actions": [{"type": "key", "keys": "ctrl+u"}]}
    assert call(screen_guest, "/v1/screen/actions", token, "POST", json=clear).status_code == 200
    # No route names another desktop.
    for path in (f"/v1/desktops/{theirs.id}/screen/actions", f"/v1/screen/actions/{theirs.id}"):
        assert call(screen_guest, path, token, "POST", json=clear).status_code == 404


def test_no_screen_without_a_live_desktops_own_token(screen_guest, screen_desktop, members):
    desktop, token = screen_desktop
    act = {"actions": [{"type": "move", "x": 1, "y": 1}]}
    for wrong in (None, "guess", token + "x", api_key_for(members[Role.OWNER])):
        look = call(screen_guest, "/v1/screen/screenshot", wrong)
        acted = call(screen_guest, "/v1/screen/actions", wrong, "POST", json=act)
        assert look.status_code in (401, 403) and acted.status_code in (401, 403), (wrong, look.text)
        assert "error" in look.json() and "data" not in look.json()
    desktop.state = "destroyed"
    desktop.save(update_fields=["state"])
    assert call(screen_guest, "/v1/screen/screenshot", token).status_code == 401
    assert call(screen_guest, "/v1/screen/actions", token, "POST", json=act).status_code == 401
    assert not AuditEvent.objects.filter(action="desktop.screen.actions").exists()


def test_a_stopped_desktops_screen_is_a_409(screen_guest, screen_desktop):
    desktop, token = screen_desktop
    desktop.state = "stopped"
    desktop.save(update_fields=["state"])
    assert call(screen_guest, "/v1/screen/screenshot", token).status_code == 409
    act = {"actions": [{"type": "move", "x": 1, "y": 1}]}
    assert call(screen_guest, "/v1/screen/actions", token, "POST", json=act).status_code == 409


BAD_BATCHES = {
    "outside the screen": [{"type": "click", "x": WIDTH, "y": 10}],
    "unknown key": [{"type": "key", "keys": "ctrl+nokey"}],
    "a control character in text": [{"type": "type", "text": "ok\x03"}],
    "too many actions": [{"type": "wait", "ms": 0}] * 101,
    "unknown action": [{"type": "teleport", "x": 1, "y": 1}],
    "not an object": ["click"],
}


@pytest.mark.parametrize("batch", BAD_BATCHES.values(), ids=BAD_BATCHES.keys())
def test_a_bad_batch_from_the_agent_is_a_400_and_nothing_of_it_is_done(screen_guest, screen_desktop, batch):
    _, token = screen_desktop
    before = drawn(screen_guest, token)
    # Good actions first: had the batch been done until its bad action, they would show.
    good = [{"type": "move", "x": 100, "y": 40}, {"type": "type", "text": "echo half-done"}]
    refused = call(screen_guest, "/v1/screen/actions", token, "POST", json={"actions": [*good, *batch]})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "invalid" and error["message"]
    time.sleep(0.2)
    assert ImageChops.difference(before, drawn(screen_guest, token)).getbbox() is None
    assert not AuditEvent.objects.filter(action="desktop.screen.actions").exists()


SCREEN_PLUGIN = ROOT / "desktops" / "agent_plugins" / "bureau-screen" / "index.mjs"
# OpenClaw's side of the screen plugin, as far as the plugin sees it: it registers its tools, which the
# agent then calls (here: a look, then a batch with a screenshot after); their results are printed.
SCREEN_TOOLS = """
const plugin = (await import(process.argv[1])).default;
const tools = {};
plugin.register({ registerTool: (tool) => (tools[tool.name] = tool) });
const brief = (result) => result.content.map((b) => (b.type === "image" ? { ...b, data: b.data.length } : b));
const look = await tools.screen_look.execute("call_1", { width: 320 });
const act = await tools.screen_act.execute("call_2", {
  actions: [{ type: "move", x: 100, y: 40 }, { type: "key", keys: "ctrl+u" }],
  screenshot: true,
});
let refused = null;
try {
  await tools.screen_act.execute("call_3", { actions: [{ type: "click", x: 5000, y: 1 }] });
} catch (error) {
  refused = error.message;
}
console.log(JSON.stringify({
  names: Object.keys(tools),
  modes: Object.values(tools).map((tool) => tool.catalogMode),
  look: brief(look),
  act: brief(act),
  refused,
}));
"""


def test_openclaws_screen_tools_answer_with_the_image_and_its_scale(screen_guest, screen_desktop, tmp_path):
    _, token = screen_desktop
    config = tmp_path / "bureau"
    config.mkdir()
    (config / "guest_url").write_text(screen_guest + "\n")
    (config / "token").write_text(token + "\n")
    env = {**os.environ, "BUREAU_CONFIG_DIR": str(config)}
    node = subprocess.run(
        ["node", "--input-type=module", "-e", SCREEN_TOOLS, SCREEN_PLUGIN.as_uri()],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert node.returncode == 0, node.stderr
    out = json.loads(node.stdout)
    # Offered to the model directly, not behind Tool Search (whose `tool_call` answers text only).
    assert out["names"] == ["screen_look", "screen_act"] and out["modes"] == ["direct-only"] * 2
    text, image = out["look"]
    assert text["type"] == "text" and "320x200 of the 640x400 screen, scale 0.5" in text["text"]
    assert image["type"] == "image" and image["mimeType"] == "image/png" and image["data"] > 100
    assert out["act"][0] == {"type": "text", "text": "Done: 2 action(s)."}
    assert [block["type"] for block in out["act"][1:]] == ["text", "image"]
    assert "640x400 of the 640x400 screen, scale 1" in out["act"][1]["text"]
    # The control plane's own words reach the agent.
    assert out["refused"] == "Action 0: the point 5000,1 is outside the 640x400 screen."
