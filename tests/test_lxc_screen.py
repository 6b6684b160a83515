"""The screen as an API on a real LXC desktop: what its VNC session shows, and input typed into it.

One desktop for all of it (a desktop takes seconds to make): a viewer's screenshot of the session's
terminal, a command typed into that terminal whose output file and pixels show it ran, and Unicode text
typed into a UTF-8 terminal and read back byte for byte.
"""

import base64
import io
import time

from PIL import Image, ImageChops

from desktops.models import AuditEvent, Role
from tests.conftest import LXC_DESKTOP_TESTS, client_for
from tests.factories import api_key_for
from tests.support.desktops import provision, run

pytestmark = LXC_DESKTOP_TESTS

UNICODE = "Les élèves à l'école : « ça va », 10 € — ok"


def screenshot(api, desktop) -> Image.Image:
    response = api.get(f"/api/desktops/{desktop.id}/screenshot")
    assert response.status_code == 200, response.content
    return Image.open(io.BytesIO(response.content)).convert("RGB")


def wait_for(condition, timeout=20):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def act(api, desktop, *actions, **options):
    response = api.post(f"/api/desktops/{desktop.id}/actions", {"actions": actions, **options}, format="json")
    assert response.status_code == 200, response.content
    return response.json()


def test_the_screen_of_a_real_desktop_is_seen_and_typed_into(lxc_api, members):
    desktop = provision(lxc_api, "screen-api")
    viewer = client_for(key=api_key_for(members[Role.VIEWER]))

    # The session's terminal, drawn on the 1280x800 screen, seen with the view-only password.
    def drawn():
        colours = screenshot(viewer, desktop).getcolors(maxcolors=1 << 24)
        return len(colours) > 2 and max(count for count, _ in colours) < 1280 * 800 * 0.9

    wait_for(drawn)
    before = screenshot(viewer, desktop)
    assert before.size == (1280, 800)
    assert viewer.get(f"/api/desktops/{desktop.id}/screen").json()["width"] == 1280
    refused = viewer.post(
        f"/api/desktops/{desktop.id}/actions", {"actions": [{"type": "wait", "ms": 1}]}, format="json"
    )
    assert refused.status_code == 403

    # A command typed into the terminal (the xterm at 40,40 that vnc-session keeps open) runs.
    done = act(
        lxc_api,
        desktop,
        {"type": "click", "x": 300, "y": 200},
        {"type": "type", "text": "echo typed-through-the-api > ~/typed.txt"},
        {"type": "key", "keys": "enter"},
        screenshot=True,
    )
    after = Image.open(io.BytesIO(base64.b64decode(done["screenshot"]["data"]))).convert("RGB")
    assert ImageChops.difference(before, after).getbbox() is not None, "the typing does not show"
    wait_for(lambda: run(desktop, "cat ~/typed.txt 2>/dev/null || true").strip() == "typed-through-the-api")

    # Any Unicode, typed as X keysyms, into a terminal of a UTF-8 locale that writes what it gets to a file.
    run(
        desktop,
        "DISPLAY=:0 LANG=C.UTF-8 nohup xterm -geometry 80x4+600+600 -e sh -c 'cat > ~/unicode.txt'"
        " >/dev/null 2>&1 &",
    )
    wait_for(lambda: ImageChops.difference(after, screenshot(viewer, desktop)).getbbox() is not None)
    act(
        lxc_api,
        desktop,
        {"type": "click", "x": 700, "y": 630},
        {"type": "type", "text": UNICODE + "\n"},
        {"type": "key", "keys": "ctrl+d"},
    )
    wait_for(lambda: run(desktop, "cat ~/unicode.txt 2>/dev/null || true") == UNICODE + "\n")
    assert AuditEvent.objects.filter(action="desktop.screen.actions", target=desktop.id).count() == 2
