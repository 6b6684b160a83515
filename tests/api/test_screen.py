"""The screen as an API (screenshot, size, input actions) against a real Xvnc with an xterm on it.

The desktop's VNC server is TigerVNC's, as in the image, asking for the desktop's own passwords. Who
may look and who may act is checked with each role's API key; every bad batch is refused whole.
"""

import base64
import io
import time

import pytest
from PIL import Image, ImageChops

from desktops import approvals
from desktops.audit import Actor
from desktops.guest import vnc_password_file
from desktops.models import AuditEvent, DesktopState, Role
from tests.conftest import client_for
from tests.factories import DesktopFactory, api_key_for
from tests.support import services as real

pytestmark = pytest.mark.django_db

SCREEN_DESKTOP = "dsk_screenapitest0"
WIDTH, HEIGHT = 640, 400


@pytest.fixture(scope="module")
def vnc_server(tmp_path_factory):
    passwords = tmp_path_factory.mktemp("vnc") / "passwd"
    passwords.write_bytes(vnc_password_file(SCREEN_DESKTOP))
    with real.xvnc(geometry=f"{WIDTH}x{HEIGHT}", password_file=passwords) as server:
        yield server


@pytest.fixture
def desktop(settings, vnc_server, workspace, plan):
    settings.DESKTOP_VNC_PORT = vnc_server[1]
    return DesktopFactory(
        id=SCREEN_DESKTOP, workspace=workspace, state=DesktopState.RUNNING, private_ip="127.0.0.1"
    )


@pytest.fixture
def api(members):
    return {role: client_for(key=api_key_for(members[role])) for role in members}


def image_of(response) -> Image.Image:
    return Image.open(io.BytesIO(response.content))


def blank(image: Image.Image) -> bool:
    """One colour (the root window's) covering nearly all of the screen."""
    return max(count for count, _ in image.getcolors(maxcolors=1 << 24)) > image.width * image.height * 0.95


def drawn(api, desktop, timeout=10) -> Image.Image:
    """The screen once the xterm is on it (it maps a moment after the server starts)."""
    deadline = time.monotonic() + timeout
    while True:
        image = image_of(api[Role.VIEWER].get(f"/api/desktops/{desktop.id}/screenshot"))
        if not blank(image) or time.monotonic() > deadline:
            return image
        time.sleep(0.2)


def act(client, desktop, *actions, **options):
    body = {"actions": list(actions), **options}
    return client.post(f"/api/desktops/{desktop.id}/actions", body, format="json")


# Looking


def test_a_viewer_takes_a_screenshot_of_the_screen_as_it_is(api, desktop):
    image = drawn(api, desktop)
    assert image.format == "PNG" and image.size == (WIDTH, HEIGHT)
    assert not blank(image), "the xterm's window is not on the screen"


def test_a_screenshot_scaled_down_says_by_how_much_and_jpeg_is_there_too(api, desktop):
    response = api[Role.VIEWER].get(f"/api/desktops/{desktop.id}/screenshot?format=jpeg&width=320")
    assert response.status_code == 200 and response["Content-Type"] == "image/jpeg"
    assert image_of(response).format == "JPEG" and image_of(response).size == (320, 200)
    assert (response["X-Screen-Width"], response["X-Screen-Height"]) == (str(WIDTH), str(HEIGHT))
    assert float(response["X-Screenshot-Scale"]) == 0.5
    assert response["Cache-Control"] == "no-store"
    # Never scaled up: the screen's own size, scale 1.
    response = api[Role.VIEWER].get(f"/api/desktops/{desktop.id}/screenshot?width=4000")
    assert image_of(response).size == (WIDTH, HEIGHT) and float(response["X-Screenshot-Scale"]) == 1


@pytest.mark.parametrize("query", ["format=gif", "width=0", "width=abc", "width=100000", "format="])
def test_a_screenshot_asked_for_wrongly_is_a_400_in_json(api, desktop, query):
    response = api[Role.VIEWER].get(f"/api/desktops/{desktop.id}/screenshot?{query}")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid"


def test_the_screen_tells_its_size(api, desktop):
    screen = api[Role.VIEWER].get(f"/api/desktops/{desktop.id}/screen").json()
    assert (screen["width"], screen["height"]) == (WIDTH, HEIGHT)
    assert "cursor" in screen and screen["name"]


@pytest.mark.parametrize("path", ["screenshot", "screen"])
def test_an_outsider_sees_no_screen(api, desktop, path):
    response = api["outsider"].get(f"/api/desktops/{desktop.id}/{path}")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


# Acting


def test_typing_unicode_into_the_terminal_shows_on_the_screen_and_is_audited(api, desktop):
    before = drawn(api, desktop).convert("RGB")
    response = act(
        api[Role.MEMBER],
        desktop,
        {"type": "move", "x": 100, "y": 40},  # the xterm has the focus where the pointer is
        {"type": "type", "text": "echo Les élèves à l'école, ça va"},
        {"type": "key", "keys": "ctrl+e"},
        {"type": "wait", "ms": 10},
        screenshot=True,
    )
    assert response.status_code == 200, response.content
    done = response.json()
    assert done["count"] == 4
    shot = done["screenshot"]
    assert (shot["contentType"], shot["width"], shot["height"], shot["scale"]) == ("image/png", 640, 400, 1)
    after = Image.open(io.BytesIO(base64.b64decode(shot["data"]))).convert("RGB")
    changed = ImageChops.difference(before, after).getbbox()
    assert changed is not None, "the typed text is not on the screen"
    # In the xterm's window (60x10 at 10,10), nowhere else.
    left, top, right, bottom = changed
    assert left >= 10 and top >= 10 and right < 10 + 60 * 8 and bottom < 10 + 10 * 20

    event = AuditEvent.objects.get(action="desktop.screen.actions", target=desktop.id)
    assert event.detail == {"count": 4, "types": ["key", "move", "type", "wait"], "typed": 32}
    assert "élèves" not in str(event.detail)  # what was typed is not kept
    act(api[Role.MEMBER], desktop, {"type": "key", "keys": "ctrl+u"})  # the next test's prompt is empty


def test_clicks_drags_and_scrolls_are_taken(api, desktop):
    response = act(
        api[Role.OWNER],
        desktop,
        {"type": "click", "x": 5, "y": 5, "button": "right", "double": True},
        {"type": "drag", "x": 20, "y": 20, "toX": 200, "toY": 30},
        {"type": "scroll", "x": 100, "y": 40, "dy": 3, "dx": -1},
        {"type": "key", "keys": "shift+Insert"},
        {"type": "key", "keys": "ctrl+u"},
    )
    assert response.status_code == 200, response.content
    assert response.json() == {"count": 5, "screenshot": None}


def test_a_viewer_may_not_act_and_an_outsider_sees_nothing_to_act_on(api, desktop):
    before = drawn(api, desktop)
    typing = {"type": "type", "text": "rm -rf ~\n"}
    viewer = act(api[Role.VIEWER], desktop, {"type": "move", "x": 100, "y": 40}, typing)
    assert viewer.status_code == 403 and viewer.json()["error"]["code"] == "permission_denied"
    assert act(api["outsider"], desktop, typing).status_code == 404
    assert ImageChops.difference(before, drawn(api, desktop)).getbbox() is None
    assert not AuditEvent.objects.filter(action="desktop.screen.actions").exists()


def test_the_control_role_of_the_workspace_decides_who_acts(api, desktop, workspace):
    workspace.control_role = Role.ADMIN
    workspace.save()
    assert act(api[Role.MEMBER], desktop, {"type": "wait", "ms": 1}).status_code == 403
    assert act(api[Role.ADMIN], desktop, {"type": "wait", "ms": 1}).status_code == 200


BAD_BATCHES = {
    "unknown action": [{"type": "teleport", "x": 1, "y": 1}],
    "missing coordinates": [{"type": "click", "x": 1}],
    "a field the action does not take": [{"type": "move", "x": 1, "y": 1, "text": "a"}],
    "negative coordinates": [{"type": "move", "x": -1, "y": 1}],
    "outside the screen": [{"type": "click", "x": WIDTH, "y": 10}],
    "drag off the screen": [{"type": "drag", "x": 1, "y": 1, "toX": 5, "toY": HEIGHT + 1}],
    "too many actions": [{"type": "wait", "ms": 0}] * 101,
    "too long a text": [{"type": "type", "text": "a" * 2001}],
    "text that is not a string": [{"type": "type", "text": 12}],
    "an empty text": [{"type": "type", "text": ""}],
    "a control character in text": [{"type": "type", "text": "ok\x03"}],
    "unknown key": [{"type": "key", "keys": "ctrl+nokey"}],
    "an empty key": [{"type": "key", "keys": "ctrl+"}],
    "too long a wait": [{"type": "wait", "ms": 10001}],
    "too long waits in all": [{"type": "wait", "ms": 10000}] * 4,
    "a scroll of nothing": [{"type": "scroll", "x": 1, "y": 1}],
    "an unknown button": [{"type": "click", "x": 1, "y": 1, "button": "fourth"}],
    "not an object": ["click"],
    "a type that is an object": [{"type": {}}],
    "a type that is a list": [{"type": ["click"]}],
}


@pytest.mark.parametrize("batch", BAD_BATCHES.values(), ids=BAD_BATCHES.keys())
def test_a_bad_batch_is_a_400_and_nothing_of_it_is_done(api, desktop, batch):
    before = drawn(api, desktop)
    # Good actions first: had the batch been done until its bad action, they would show.
    good = [{"type": "move", "x": 100, "y": 40}, {"type": "type", "text": "echo half-done"}]
    response = act(api[Role.MEMBER], desktop, *good, *batch)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid" and error["message"]
    time.sleep(0.2)
    assert ImageChops.difference(before, drawn(api, desktop)).getbbox() is None
    assert not AuditEvent.objects.filter(action="desktop.screen.actions").exists()


def test_a_batch_of_no_action_is_a_400(api, desktop):
    response = act(api[Role.MEMBER], desktop)
    assert response.status_code == 400 and response.json()["error"]["message"].startswith("actions:")


def test_a_point_outside_the_screen_is_named_in_the_error(api, desktop):
    response = act(api[Role.MEMBER], desktop, {"type": "wait", "ms": 0}, {"type": "click", "x": 5, "y": 400})
    assert response.json()["error"]["message"] == "Action 1: the point 5,400 is outside the 640x400 screen."


def test_a_french_speaker_reads_the_errors_in_french(api, desktop):
    body = {"actions": [{"type": "key", "keys": "ctrl+nokey"}]}
    url = f"/api/desktops/{desktop.id}/actions"
    response = api[Role.MEMBER].post(url, body, format="json", HTTP_ACCEPT_LANGUAGE="fr")
    assert "n'est pas un nom de touche" in response.json()["error"]["message"]


# Where the screen is not


def test_a_stopped_desktop_answers_409(api, desktop):
    desktop.state = DesktopState.STOPPED
    desktop.save()
    assert api[Role.VIEWER].get(f"/api/desktops/{desktop.id}/screenshot").status_code == 409
    assert api[Role.VIEWER].get(f"/api/desktops/{desktop.id}/screen").status_code == 409
    response = act(api[Role.MEMBER], desktop, {"type": "move", "x": 1, "y": 1})
    assert response.status_code == 409 and response.json()["error"]["code"] == "conflict"


@pytest.mark.django_db(transaction=True)  # the engine is asked from a thread of its own
def test_a_screen_that_does_not_answer_is_a_503(api, desktop, settings):
    settings.DESKTOP_VNC_PORT = real.free_port()
    response = api[Role.VIEWER].get(f"/api/desktops/{desktop.id}/screenshot")
    assert response.status_code == 503 and response.json()["error"]["code"] == "unavailable"


# A request for approval keeps the screen the agent was looking at


def test_a_request_for_approval_keeps_the_screen_as_it_asked(api, desktop, members, client):
    drawn(api, desktop)
    approval = approvals.approval_request(desktop=desktop, title="Déployer en prod")
    assert approvals.approval_screenshot_take(approval_id=approval.id) is True

    assert api[Role.VIEWER].get(f"/api/approvals/{approval.id}").json()["hasScreenshot"] is True
    image = image_of(api[Role.VIEWER].get(f"/api/approvals/{approval.id}/screenshot"))
    assert image.format == "JPEG" and image.size == (WIDTH, HEIGHT) and not blank(image)
    assert api["outsider"].get(f"/api/approvals/{approval.id}/screenshot").status_code == 404
    client.force_login(members[Role.VIEWER].user)
    queue = client.get(f"/w/{desktop.workspace_id}/approvals/").content.decode()
    assert f'src="/api/approvals/{approval.id}/screenshot"' in queue

    # Once answered, the request keeps its screen and takes no other.
    owner = Actor(user=members[Role.OWNER].user)
    approvals.approval_decide(actor=owner, approval_id=approval.id, approve=False)
    assert approvals.approval_screenshot_take(approval_id=approval.id) is False
    # A desktop whose screen cannot be read: the request stands without one.
    stopped = approvals.approval_request(desktop=desktop, title="Encore")
    desktop.state = DesktopState.STOPPED
    desktop.save(update_fields=["state"])
    assert approvals.approval_screenshot_take(approval_id=stopped.id) is False
    assert api[Role.VIEWER].get(f"/api/approvals/{stopped.id}/screenshot").status_code == 404
