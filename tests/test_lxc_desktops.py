"""Real desktops through the API: LXC containers made by the Celery worker from the golden image."""

import json
import subprocess
import time
from pathlib import Path

from desktops.guest import vnc_password
from desktops.models import Desktop
from tests.conftest import LXC_DESKTOP_TESTS, LXC_TEST_SETTINGS
from tests.support.desktops import act, provision, run, wait_for_state
from tests.support.rfb import wait_for_a_drawn_screen

pytestmark = LXC_DESKTOP_TESTS


def lease(desktop_id: str) -> str | None:
    """The address the engine's record of the desktop holds, if it has one."""
    meta = Path(LXC_TEST_SETTINGS["LXC_STATE_DIR"]) / desktop_id / "meta.json"
    return json.loads(meta.read_text())["ip"] if meta.exists() else None


def step(api, desktop: Desktop, action: str, final: str) -> Desktop:
    assert act(api, desktop.id, action).status_code == 202
    return wait_for_state(desktop.id, final, "error", timeout=90)


def test_a_desktop_from_the_api_runs_with_ssh_vnc_and_its_helper(lxc_api):
    desktop = provision(lxc_api, "lxc-api")
    detail = lxc_api.get(f"/api/desktops/{desktop.id}").json()
    assert detail["privateIp"].startswith("10.215.0.")
    assert detail["image"]["profile"] == "minimal" and len(detail["image"]["packagesSha256"]) == 64
    assert lease(desktop.id) == desktop.private_ip

    status = run(desktop, "bureau status")
    assert desktop.id in status and "token:    present" in status
    assert Desktop.objects.get(id=desktop.id).ssh_host_key.startswith("ssh-ed25519 ")

    _, _, drawn, colours = wait_for_a_drawn_screen(desktop.private_ip, vnc_password(desktop.id, "view"))
    assert drawn > 0.05 and colours >= 16, "the desktop's screen is blank"


def test_files_survive_stop_and_suspend_but_not_destroy(lxc_api):
    desktop = provision(lxc_api, "keeper")
    run(desktop, "echo kept > ~/work.txt")

    step(lxc_api, desktop, "stop", "stopped")
    assert step(lxc_api, desktop, "start", "running").state == "running"
    assert run(desktop, "cat ~/work.txt").strip() == "kept"

    run(desktop, "nohup sleep 600 >/dev/null 2>&1 & echo $! > ~/sleeper.pid")
    step(lxc_api, desktop, "suspend", "suspended")
    assert step(lxc_api, desktop, "resume", "running").state == "running"
    assert run(desktop, "kill -0 $(cat ~/sleeper.pid) && cat ~/work.txt").strip() == "kept"

    step(lxc_api, desktop, "destroy", "destroyed")
    assert lease(desktop.id) is None
    assert subprocess.run(["lxc-info", "-P", LXC_TEST_SETTINGS["LXC_PATH"], "-n", desktop.id]).returncode != 0

    again = provision(lxc_api, "keeper")
    assert again.id != desktop.id
    assert run(again, "test -e ~/work.txt || echo gone").strip() == "gone"


def test_a_desktop_stopped_behind_our_back_is_started_again_by_reconcile(lxc_api):
    """As after a restart of the host: the container is gone from memory, the desktop comes back."""
    from desktops import lifecycle

    desktop = provision(lxc_api, "rebooted")
    subprocess.run(["lxc-stop", "-k", "-P", LXC_TEST_SETTINGS["LXC_PATH"], "-n", desktop.id], check=True)
    time.sleep(0.5)
    report = lifecycle.reconcile()
    assert report["restarted"] == [desktop.id]
    desktop = wait_for_state(desktop.id, "running", timeout=60)
    assert run(desktop, "echo back").strip() == "back"


def test_chat_runs_the_agent_command_in_the_desktop(lxc_api, workspace):
    desktop = provision(lxc_api, "chatty")
    url = f"/api/desktops/{desktop.id}/chat"

    # The minimal image has no agent runtime: the answer says so plainly.
    reply = lxc_api.post(url, {"message": "bonjour"}, format="json").json()
    answer = wait_for_reply(reply["id"])
    assert answer.status == "error" and "no agent runtime" in answer.content
    assert "OpenClaw is not installed" in answer.content

    # Any agent framework plugs in through the workspace's command; the message arrives quoted.
    workspace.agent_command = 'sh -c \'echo "$1" > ~/last-task; echo agent heard: "$1"\' agent {message}'
    workspace.save(update_fields=["agent_command"])
    reply = lxc_api.post(url, {"message": "crée le fichier; rm -rf /"}, format="json").json()
    answer = wait_for_reply(reply["id"])
    assert (answer.status, answer.content) == ("done", "agent heard: crée le fichier; rm -rf /")
    assert run(desktop, "cat ~/last-task").strip() == "crée le fichier; rm -rf /"
    history = lxc_api.get(url).json()["results"]
    assert [m["author"] for m in history] == ["operator", "agent", "operator", "agent"]


def wait_for_reply(message_id: str, timeout: float = 30):
    from desktops.models import ChatMessage

    deadline = time.monotonic() + timeout
    while (message := ChatMessage.objects.get(id=message_id)).status in ("queued", "running"):
        assert time.monotonic() < deadline, f"no answer: {message.status}"
        time.sleep(0.1)
    return message


def test_resource_use_is_read_from_the_container(lxc_api, workspace, client, members):
    desktop = provision(lxc_api, "measured")
    from desktops.engines import engine

    usage = engine("lxc").usage(desktop.id)
    assert 10 * 2**20 < usage.memory_bytes < desktop.plan.memory_mib * 2**20 and usage.cpu_seconds > 0
    client.force_login(members["member"].user)
    page = client.get(f"/desktops/{desktop.id}/").content.decode()
    assert "MiB of memory" in page and "s of CPU since start" in page


def test_one_tenants_long_agent_turns_do_not_hold_up_anothers_stop(lxc_api, workspace, members):
    """Agent turns used to be followed on the lifecycle queue: four slow turns of one tenant and
    nobody's desktop started or stopped (a stop took 51 s instead of 0.7). Turns have their own
    queue and workers now."""
    from desktops.models import ChatMessage
    from tests.conftest import client_for
    from tests.factories import SubscriptionFactory, api_key_for

    # Four running desktops: more than the free tier allows, which is not what is under test.
    SubscriptionFactory(workspace=workspace)
    workspace.agent_command = "sleep 25; echo {message}"
    workspace.save(update_fields=["agent_command"])
    slow = [provision(lxc_api, f"slow-{i}") for i in range(4)]
    other_api = client_for(key=api_key_for(members["outsider"]))
    other = provision(other_api, "elsewhere")
    turns = [
        lxc_api.post(f"/api/desktops/{d.id}/chat", {"message": "long"}, format="json").json() for d in slow
    ]
    deadline = time.monotonic() + 20
    while ChatMessage.objects.filter(id__in=[t["id"] for t in turns], status="running").count() < 4:
        assert time.monotonic() < deadline, "the slow turns never started"
        time.sleep(0.2)
    assert act(other_api, other.id, "stop").status_code == 202
    assert wait_for_state(other.id, "stopped", "error", timeout=20).state == "stopped"
    still_running = ChatMessage.objects.filter(id__in=[t["id"] for t in turns], status="running").count()
    assert still_running == 4, "the other tenant's stop waited for the agent turns to end"
