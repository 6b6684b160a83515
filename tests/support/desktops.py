"""Driving desktops through the API in tests, and reaching into them."""

import shlex
import time
from pathlib import Path

from desktops.guest import desktop_ssh_connect
from desktops.models import Desktop


def wait_for_state(desktop_id: str, *states: str, timeout: float = 30) -> Desktop:
    deadline = time.monotonic() + timeout
    while True:
        desktop = Desktop.objects.get(id=desktop_id)
        if desktop.state in states:
            return desktop
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{desktop_id} stayed {desktop.state}, wanted {states}: {desktop.last_error}"
            )
        time.sleep(0.05)


def act(api, desktop_id: str, step: str):
    if step == "destroy":
        return api.delete(f"/api/desktops/{desktop_id}")
    return api.post(f"/api/desktops/{desktop_id}/{step}")


def provision(api, name: str, profile: str = "minimal") -> Desktop:
    """A running desktop made through the API, or an assertion error with the reason."""
    response = api.post("/api/desktops", {"name": name, "imageProfile": profile}, format="json")
    assert response.status_code == 201, response.content
    desktop = wait_for_state(response.json()["id"], "running", "error", timeout=120)
    assert desktop.state == "running", desktop.last_error
    return desktop


def run(desktop: Desktop, command: str, user: str = "agent") -> str:
    """Run a command in the desktop over SSH; its standard output, or an assertion error."""
    with desktop_ssh_connect(desktop_id=desktop.id, host=desktop.private_ip, username=user) as ssh:
        _, out, err = ssh.exec_command(command, timeout=30)
        status = out.channel.recv_exit_status()
        assert status == 0, err.read().decode()
        return out.read().decode()


def add_scripted_model_key(api, workspace, secret: str) -> dict:
    """Give the workspace a key to the scripted model server (`scripted_model` fixture)."""
    from tests.conftest import SCRIPTED_MODEL_URL

    body = {
        "workspaceId": workspace.id,
        "provider": "openai_compatible",
        "name": "scripted",
        "baseUrl": SCRIPTED_MODEL_URL,
        "model": "scripted",
        "secret": secret,
    }
    response = api.post("/api/llm-keys", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()


# The desktop's X clipboard, read and set from inside it (see x_clipboard_guest.py).
CLIPBOARD_SCRIPT = shlex.quote((Path(__file__).parent / "x_clipboard_guest.py").read_text())


def desktop_clipboard(desktop: Desktop) -> str:
    """What a program in the desktop would paste from its clipboard."""
    return run(desktop, f"python3 -c {CLIPBOARD_SCRIPT} get")


def copy_in_desktop(desktop: Desktop, text: str) -> None:
    """Copy `text` in the desktop, as a program there does: it holds the clipboard until another takes it."""
    run(desktop, f"setsid python3 -c {CLIPBOARD_SCRIPT} set {shlex.quote(text)} >/dev/null 2>&1 </dev/null &")
