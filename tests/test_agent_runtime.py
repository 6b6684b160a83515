"""The agent inside a real desktop: BYOK keys, the warm OpenClaw gateway, streamed answers.

Real LXC desktops of the full image run the real OpenClaw; the only double is the model: a
scripted OpenAI-compatible server on the test bridge's host address (no LLM is reachable here).
"""

import base64
import io
import json
import secrets
import shlex
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import redis
from celery.signals import before_task_publish
from django.utils.translation import gettext
from PIL import Image

from desktops.models import Approval, AuditEvent, ChatMessage, Desktop, Role
from desktops.selectors import chat_content
from lebureau.celery import app as celery_app
from tests.conftest import (
    BRIDGE_PAGE_PORT,
    CHAT_NODE,
    FULL_IMAGE,
    SCRIPTED_MODEL_HOST,
    TEST_BROKER,
    TEST_CHAT_QUEUE,
    TEST_QUEUE,
    node_answers,
    service_env,
)
from tests.support.agent_loop import wait_for
from tests.support.desktops import add_scripted_model_key as add_key
from tests.support.desktops import provision, run
from tests.support.scripted_model import Text, ToolCall
from tests.support.services import service_process

pytestmark = [
    pytest.mark.lxc,
    pytest.mark.worker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not FULL_IMAGE.is_file(), reason="no full golden image (make setup builds it)"),
]
CONFIG = "~/.openclaw/openclaw.json"


@pytest.fixture
def admin_api(members):
    from tests.conftest import api_key_for, client_for

    return client_for(key=api_key_for(members[Role.ADMIN]))


@pytest.fixture
def published():
    """Every task message this process sends, as Celery serialised it."""
    sent: list[str] = []

    def record(body=None, headers=None, **_):
        sent.append(json.dumps([body, headers], default=str))

    before_task_publish.connect(record, weak=False)
    yield sent
    before_task_publish.disconnect(record)


def wait_for_config(desktop, *, containing: str = "", absent: str = "", timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while True:
        text = run(desktop, f"cat {CONFIG} 2>/dev/null || true")
        if (not containing or containing in text) and (not absent or absent not in text):
            return text
        assert time.monotonic() < deadline, "the desktop's agent configuration was not rewritten"
        time.sleep(0.3)


def wait_until_warm(desktop) -> None:
    """Until the desktop's own warm-up turn is over: a first boot's gateway start and warm-up turn take
    a minute and more on a small, busy host, and a turn sent meanwhile waits behind them (a deadline on
    that turn would then time the boot, not the turn)."""
    warm = "cat ~/.cache/bureau/agent-warm 2>/dev/null || true"
    wait_for(lambda: run(desktop, warm).strip(), "the agent was not warmed up", timeout=180)


def chat(api, desktop, message: str) -> dict:
    response = api.post(f"/api/desktops/{desktop.id}/chat", {"message": message}, format="json")
    assert response.status_code == 202, response.content
    return response.json()


def answer_of(message_id: str, timeout: float = 120) -> ChatMessage:
    deadline = time.monotonic() + timeout
    while (message := ChatMessage.objects.get(id=message_id)).status in ("queued", "running"):
        assert time.monotonic() < deadline, f"no answer: {message.status} {message.content!r}"
        time.sleep(0.1)
    return message


def test_keys_reach_the_agent_and_nowhere_else(
    lxc_api, admin_api, workspace, scripted_model, published, tmp_path_factory
):
    secret = f"sk-scripted-{secrets.token_hex(12)}"
    created = add_key(admin_api, workspace, secret)
    desktop = provision(lxc_api, "agent-keys", profile="full")

    # In the desktop: the runtime's file, the agent's alone.
    text = wait_for_config(desktop, containing=secret)
    assert run(desktop, f"stat -c '%a %U' {CONFIG}").split() == ["600", "agent"]
    assert run(desktop, "stat -c '%a' ~/.openclaw").strip() == "700"
    nobody = run(desktop, "sudo -u nobody cat /home/agent/.openclaw/openclaw.json 2>&1 || echo refused")
    assert "refused" in nobody and secret not in nobody
    assert json.loads(text)["agents"]["defaults"]["model"]["primary"].endswith("/scripted")
    # The desktop warmed its agent up as it booted, on a model of its own loopback: no provider was
    # asked, no token spent.
    wait_until_warm(desktop)
    assert scripted_model.requests == []

    # The whole path: API → SSH → OpenClaw → scripted model asking for a command → command run → answer.
    scripted_model.script(
        ToolCall("exec", {"command": "echo made-by-the-agent > /home/agent/proof.txt"}),
        Text("I created proof.txt in your home."),
    )
    reply = chat(lxc_api, desktop, "Crée le fichier proof.txt")
    assert reply["status"] == "queued" and reply["id"].startswith("msg_")
    answer = answer_of(reply["id"])
    assert (answer.status, answer.content) == ("done", "I created proof.txt in your home.")
    assert run(desktop, "cat ~/proof.txt").strip() == "made-by-the-agent"
    assert [r["headers"]["authorization"] for r in scripted_model.requests] == [f"Bearer {secret}"] * 2

    # What the turn cost, as the runtime reported it: two model calls of 120 + 30 tokens.
    conversation = lxc_api.get(f"/api/desktops/{desktop.id}/chat").json()["results"]
    assert conversation[-1]["inputTokens"] == 240 and conversation[-1]["modelRequests"] == 2
    usage = lxc_api.get(f"/api/desktops/{desktop.id}/usage").json()
    assert usage == {"inputTokens": 240, "outputTokens": 60, "requests": 2, "turns": 1}
    total = lxc_api.get(f"/api/workspaces/{workspace.id}/usage").json()
    assert total["total"]["outputTokens"] == 60 and total["desktops"][0]["desktopId"] == desktop.id

    # Rotation reaches the running desktop, and the next turn uses the new key.
    rotated = f"sk-rotated-{secrets.token_hex(12)}"
    body = {**_key_fields(created), "secret": rotated}
    response = admin_api.put(f"/api/llm-keys/{created['id']}", body, format="json")
    assert response.status_code == 200, response.content
    wait_for_config(desktop, containing=rotated, absent=secret)
    scripted_model.script(Text("Still here."))
    assert answer_of(chat(lxc_api, desktop, "Toujours là ?")["id"]).content == "Still here."
    assert scripted_model.requests[-1]["headers"]["authorization"] == f"Bearer {rotated}"

    # Removal takes it out of the desktop too.
    assert admin_api.delete(f"/api/llm-keys/{created['id']}").status_code == 204
    wait_for_config(desktop, absent=rotated)

    # Never in an API response, an audit event, a task message, a log, or anything kept in Redis.
    for secret_value in (secret, rotated):
        responses = [
            admin_api.get("/api/llm-keys").content,
            lxc_api.get(f"/api/desktops/{desktop.id}").content,
            lxc_api.get(f"/api/desktops/{desktop.id}/chat").content,
            json.dumps(created),
            response.content.decode(),
        ]
        assert not any(secret_value in str(body) for body in responses)
        assert all(secret_value not in str(vars(e)) for e in AuditEvent.objects.all())
        assert published and not any(secret_value in message for message in published)
        logs = Path(tmp_path_factory.getbasetemp()).glob("*.log")
        assert not any(secret_value in log.read_text(errors="replace") for log in logs)
        assert not any(secret_value in blob for blob in _everything_in_redis())


def _key_fields(key: dict) -> dict:
    return {name: key[name] for name in ("provider", "name", "baseUrl", "model")}


def _everything_in_redis():
    """Every value in the suite's Redis databases (broker, results if any, channels, event streams)."""
    for db in range(16):
        client = redis.Redis.from_url(TEST_BROKER, db=db)
        for key in client.scan_iter(count=1000):
            kind = client.type(key)
            if kind == b"string":
                yield str(client.get(key))
            elif kind == b"list":
                yield str(client.lrange(key, 0, -1))
            elif kind == b"hash":
                yield str(client.hgetall(key))
            elif kind == b"zset":
                yield str(client.zrange(key, 0, -1))
            elif kind == b"set":
                yield str(client.smembers(key))


def test_a_turn_outlives_its_worker_and_the_next_message_waits(
    lxc_api, admin_api, workspace, scripted_model, celery_worker, driver_dir, tmp_path_factory
):
    add_key(admin_api, workspace, f"sk-scripted-{secrets.token_hex(12)}")
    desktop = provision(lxc_api, "agent-long", profile="full")
    wait_for_config(desktop, containing="scripted")
    long_answer = " ".join(f"word{i}" for i in range(60))
    scripted_model.script(Text(long_answer, pace=0.15), Text("Second answer."))

    # The suite's chat worker stands aside; a second one takes the turn, then dies mid-answer.
    node = next(
        n for reply in celery_app.control.ping(timeout=1) for n in reply if n.startswith(f"{CHAT_NODE}@")
    )
    celery_app.control.cancel_consumer(TEST_CHAT_QUEUE, destination=[node], reply=True)
    basetemp = tmp_path_factory.getbasetemp()
    env = service_env(driver_dir, basetemp, CHAT_STALE_AFTER="3")
    args = [sys.executable, "-m", "celery", "-A", "lebureau", "worker", "-Q", TEST_CHAT_QUEUE, "-c", "2"]
    doomed = f"doomed-{TEST_QUEUE}"
    doomed_ready = lambda: node_answers(doomed)  # noqa: E731
    try:
        doomed_args = [*args, "-n", f"{doomed}@%h"]
        with service_process("doomed-worker", doomed_args, env, basetemp, doomed_ready):
            first = chat(lxc_api, desktop, "Écris une longue réponse")
            second = chat(lxc_api, desktop, "Et une deuxième")
            deadline = time.monotonic() + 90
            while len(chat_content(ChatMessage.objects.get(id=first["id"]))) < 40:
                assert time.monotonic() < deadline, "the answer never started streaming"
                time.sleep(0.1)
            # One turn at a time: the second message waits its turn.
            assert ChatMessage.objects.get(id=second["id"]).status == "queued"
            # The worker and its pool's processes, all at once, as a machine that loses power would.
            subprocess.run(["pkill", "-9", "-f", f"{doomed}@%h"], check=True)
            half = ChatMessage.objects.get(id=first["id"])
            assert half.status == "running" and 0 < len(chat_content(half)) < len(long_answer)
    finally:
        celery_app.control.add_consumer(TEST_CHAT_QUEUE, destination=[node], reply=True)

    # What beat does every half-minute in production: hand orphaned turns on.
    deadline = time.monotonic() + 120
    while ChatMessage.objects.get(id=second["id"]).status in ("queued", "running"):
        assert time.monotonic() < deadline, "the interrupted turn was never picked up again"
        celery_app.send_task("workers.tasks.chat_resume", queue=TEST_QUEUE)
        time.sleep(1)
    first_answer, second_answer = ChatMessage.objects.get(id=first["id"]), answer_of(second["id"])
    # Picked up from where the dead worker left it: every word once, in order.
    assert (first_answer.status, first_answer.content) == ("done", long_answer)
    assert (second_answer.status, second_answer.content) == ("done", "Second answer.")
    assert first_answer.completed_at < second_answer.completed_at


def nothing_asked(desktop, scripted_model) -> str:
    """Why no approval came: what the gateway and the turn logged, and what the model was last sent."""
    log = run(desktop, "tail -n 30 /tmp/openclaw/*.log; tail -n 20 ~/.local/state/bureau/chat/*/* || true")
    sent = scripted_model.requests[-1]["body"]["messages"] if scripted_model.requests else []
    return (
        f"OpenClaw asked nothing; its log says:\n{log}\nthe model was last sent: {json.dumps(sent)[-3000:]}"
    )


def test_a_command_the_policy_names_waits_for_an_operator_and_never_runs_when_denied(
    lxc_api, admin_api, workspace, members, scripted_model, guest_endpoint
):
    from tests.conftest import api_key_for, client_for

    add_key(admin_api, workspace, f"sk-scripted-{secrets.token_hex(12)}")
    desktop = provision(lxc_api, "agent-asks", profile="full")
    wait_for_config(desktop, containing="bureau-approvals")
    wait_until_warm(desktop)
    policy = json.loads(run(desktop, "cat ~/.openclaw/bureau/approvals.json"))
    assert policy == {"commands": ["git push", "kubectl", "terraform apply", "sudo"], "timeout": 570}

    push = "cd /tmp && git push origin main 2>/dev/null; echo pushed >> /home/agent/pushed.txt"
    scripted_model.script(
        ToolCall("exec", {"command": "echo free > /home/agent/free.txt"}),
        ToolCall("exec", {"command": push}),
        Text("Pushed."),
    )
    turn = chat(lxc_api, desktop, "Publie la branche")
    request = wait_for(
        lambda: Approval.objects.filter(desktop=desktop, status="pending").first(),
        lambda: nothing_asked(desktop, scripted_model),
    )
    # Asked by OpenClaw itself, for exactly that command, in that conversation; the agent asked nothing.
    asked = json.loads(request.details)
    assert request.title == push and (asked["command"], asked["rule"]) == (push, "git push")
    assert asked["session"] == f"agent:main:{desktop.id}"  # the desktop's conversation
    assert request.turn is not None and request.turn.desktop_id == desktop.id
    # What the policy does not name ran without asking; what it names waits for a person.
    assert run(desktop, "cat ~/free.txt").strip() == "free"
    time.sleep(2)
    assert run(desktop, "cat ~/pushed.txt 2>/dev/null || echo absent").strip() == "absent"
    viewer = client_for(key=api_key_for(members[Role.VIEWER]))
    assert viewer.post(f"/api/approvals/{request.id}/approve", {}, format="json").status_code in (403, 404)
    assert run(desktop, "cat ~/pushed.txt 2>/dev/null || echo absent").strip() == "absent"

    approved = lxc_api.post(f"/api/approvals/{request.id}/approve", {"comment": "Vas-y."}, format="json")
    assert approved.status_code == 200, approved.content
    assert answer_of(turn["id"]).content == "Pushed."
    assert run(desktop, "cat ~/pushed.txt").strip() == "pushed"
    # Each command the agent ran was counted by the plugin, and reported with the desktop's own token.
    wait_for(lambda: Desktop.objects.get(id=desktop.id).agent_commands == 2, "the commands were not reported")

    # Denied: the command never runs, and the agent is told why.
    scripted_model.script(ToolCall("exec", {"command": push}), Text("Not pushed."))
    turn = chat(lxc_api, desktop, "Publie encore")
    request = wait_for(
        lambda: Approval.objects.filter(desktop=desktop, status="pending").first(), "OpenClaw asked nothing"
    )
    denied = lxc_api.post(f"/api/approvals/{request.id}/deny", {"comment": "Pas aujourd'hui."}, format="json")
    assert denied.status_code == 200, denied.content
    assert answer_of(turn["id"]).content == "Not pushed."
    assert run(desktop, "cat ~/pushed.txt").strip() == "pushed"  # still the one line of the approved run
    told = json.dumps(scripted_model.requests[-1]["body"]["messages"], ensure_ascii=False)
    assert "An operator denied this command; it did not run." in told and "Pas aujourd'hui." in told
    decided = AuditEvent.objects.get(action="approval.denied", detail__approval=request.id)
    assert decided.detail["comment"] == "Pas aujourd'hui."
    # A command refused is still one the agent tried.
    wait_for(lambda: Desktop.objects.get(id=desktop.id).agent_commands == 3, "the refusal was not reported")


# A page of one colour no desktop shows otherwise: where it covers a large part of the screen, it is on
# it (the browser is maximised; the terminal of the agent's commands may cover a corner of it).
MAGENTA = (255, 0, 255)
ON_SCREEN = 0.4
MAGENTA_PAGE = b"<!doctype html><style>html,body{margin:0;height:100%;background:#f0f}</style>"


@pytest.fixture
def bridge_page(scripted_model):
    """The magenta page, served on the desktops' bridge (up with the scripted model) for their agents."""

    class Page(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(MAGENTA_PAGE)))
            self.end_headers()
            self.wfile.write(MAGENTA_PAGE)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer((SCRIPTED_MODEL_HOST, BRIDGE_PAGE_PORT), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://{SCRIPTED_MODEL_HOST}:{BRIDGE_PAGE_PORT}/"
    server.shutdown()
    server.server_close()


def magenta_share(api, desktop) -> float:
    """How much of the desktop's screen, as the API's screenshot shows it, is the magenta page."""
    response = api.get(f"/api/desktops/{desktop.id}/screenshot")
    while response.status_code == 429:  # polled past the API's rate for screenshots: wait, as a client does
        time.sleep(float(response.get("Retry-After", 1)))
        response = api.get(f"/api/desktops/{desktop.id}/screenshot")
    assert response.status_code == 200, response.content
    image = Image.open(io.BytesIO(response.content)).convert("RGB")
    colours = dict((colour, count) for count, colour in image.getcolors(maxcolors=1 << 24))
    return colours.get(MAGENTA, 0) / (image.width * image.height)


def why_not_shown(desktop, scripted_model, turn) -> str:
    """What the turn, the gateway's log and the model's last request say."""
    message = ChatMessage.objects.get(id=turn["id"])
    pattern = "browser\\|error\\|warn\\|reload\\|restart"
    log = run(desktop, f"grep -h -i '{pattern}' /tmp/openclaw/*.log | tail -30 || true")
    sent = scripted_model.requests[-1]["body"]["messages"] if scripted_model.requests else []
    results = [json.dumps(m)[-1500:] for m in sent if m["role"] == "tool"]
    return (
        f"the page is not on the screen; the turn is {message.status}: {message.content!r}\n"
        f"the gateway's log says:\n{log}\nthe tools answered: {results}"
    )


def test_the_agent_browses_and_runs_commands_on_the_screen_the_operator_watches(
    lxc_api, admin_api, workspace, scripted_model, bridge_page, guest_endpoint
):
    add_key(admin_api, workspace, f"sk-scripted-{secrets.token_hex(12)}")
    desktop = provision(lxc_api, "agent-screen", profile="full")
    wait_for_config(desktop, containing="scripted")
    wait_until_warm(desktop)
    assert magenta_share(lxc_api, desktop) == 0

    command = "echo shown-on-the-screen"
    scripted_model.script(
        # OpenClaw offers its tools behind a search (Tool Search, its default): the browser is called
        # through `tool_call`, as a model that found it in the catalogue would.
        ToolCall("tool_call", {"id": "browser", "args": {"action": "open", "url": bridge_page}}),
        ToolCall("exec", {"command": command}),
        Text("Opened, and ran it."),
    )
    turn = chat(lxc_api, desktop, "Ouvre la page et lance la commande")
    # The browser the agent drives is the Chromium on the desktop's screen, not a headless one: the
    # operator's screenshot shows the page it opened, over a large part of the screen.
    wait_for(
        lambda: magenta_share(lxc_api, desktop) > ON_SCREEN,
        lambda: why_not_shown(desktop, scripted_model, turn),
        timeout=120,
    )
    assert answer_of(turn["id"]).content == "Opened, and ran it."
    # The browser stays open for the operator to see.
    assert magenta_share(lxc_api, desktop) > ON_SCREEN, windows_on(desktop)

    # The command, and what it printed, are in the log a terminal window on that screen follows.
    log = run(desktop, "cat ~/.cache/bureau/agent-commands.log")
    assert f"$ {command}\nshown-on-the-screen\n" in log
    title = gettext("The agent's commands")
    assert "Map State: IsViewable" in shown(desktop, title)
    follower = run(desktop, "ps -o args= -u agent")
    assert "tail -n 200 -F /home/agent/.cache/bureau/agent-commands.log" in follower

    # The window closed and the log made unwritable: the agent's next command runs all the same, and
    # the window opens again.
    run(desktop, "pkill -u agent -f '^xfce4-terminal --disable-server'; true")
    wait_for(lambda: "IsViewable" not in shown(desktop, title), "the terminal window did not close")
    run(desktop, "cd ~/.cache/bureau && rm agent-commands.log && mkdir agent-commands.log")
    scripted_model.script(ToolCall("exec", {"command": "echo still-runs > ~/still.txt"}), Text("Still ran."))
    assert answer_of(chat(lxc_api, desktop, "Encore une commande")["id"]).content == "Still ran."
    assert run(desktop, "cat ~/still.txt").strip() == "still-runs"
    wait_for(lambda: "IsViewable" in shown(desktop, title), "the terminal window did not open again")


def windows_on(desktop) -> str:
    """The screen's windows, for what covers or replaced the page when it is not shown."""
    tree = run(
        desktop,
        "DISPLAY=:0 xwininfo -root -tree 2>&1 | grep -v 'has no name.*1x1' | head -80; "
        # Whether the browser's windows are shown at all (minimised ones keep their place in the tree).
        "for w in $(DISPLAY=:0 xwininfo -root -tree | awk '/\\(\"chromium\"/ {print $1}'); do "
        "DISPLAY=:0 xwininfo -id $w | grep -E 'Window id|Map State|Absolute|Width|Height'; done; "
        # The agent's browser's tabs, from its debugging port (where each is, and what it shows).
        "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:18800/json/list', "
        'timeout=5).read().decode())" 2>/dev/null || echo "(no browser answers on its debugging port)"',
    )
    return f"the page is not on the screen; its windows and its browser's tabs:\n{tree}"


def shown(desktop, title: str) -> str:
    """What X says of the window of that title on the desktop's screen (nothing when there is none)."""
    return run(desktop, f"DISPLAY=:0 xwininfo -name {shlex.quote(title)} 2>/dev/null || true")


def images_sent(request: dict) -> list[Image.Image]:
    """The images a request to the model carries (OpenClaw sends a tool's images as a user message)."""
    images = []
    for message in request["body"]["messages"]:
        for part in message["content"] if isinstance(message["content"], list) else []:
            if part.get("type") == "image_url":
                data = part["image_url"]["url"].split("base64,", 1)[1]
                images.append(Image.open(io.BytesIO(base64.b64decode(data))))
    return images


def test_the_agent_sees_and_acts_on_its_own_screen(
    lxc_api, admin_api, workspace, scripted_model, guest_endpoint
):
    add_key(admin_api, workspace, f"sk-scripted-{secrets.token_hex(12)}")
    desktop = provision(lxc_api, "agent-hands", profile="full")
    wait_for_config(desktop, containing="bureau-screen")
    wait_until_warm(desktop)
    # A window on the screen that writes what is typed into it to a file.
    run(
        desktop,
        "DISPLAY=:0 LANG=C.UTF-8 nohup xterm -geometry 80x4+600+600 -e sh -c 'cat > ~/typed.txt'"
        " >/dev/null 2>&1 &",
    )
    wait_for(lambda: "xterm" in run(desktop, "ps -o args= -u agent"), "the window did not open")
    time.sleep(1)  # mapped

    # An accent first: the first key event a fresh screen gets is the hard case (see RfbScreen.key).
    typed = "Écrit par l'agent, ça"
    scripted_model.script(
        ToolCall(
            "screen_act",
            {
                "actions": [
                    {"type": "click", "x": 700, "y": 630},
                    {"type": "wait", "ms": 300},  # the window manager gives it the focus
                    {"type": "type", "text": typed + "\n"},
                ],
                "screenshot": True,
            },
        ),
        ToolCall("screen_look", {"width": 640}),
        Text("Typed, and looked."),
    )
    turn = chat(lxc_api, desktop, "Écris dans la fenêtre")
    answer = answer_of(turn["id"])
    log = "grep -h -i 'bureau-screen\\|screen_\\|plugin' /tmp/openclaw/*.log | tail -20 || true"
    assert answer.content == "Typed, and looked.", (answer.status, answer.content, run(desktop, log))
    # What the agent typed reached the window, through the same screen code as the API's.
    assert run(desktop, "cat ~/typed.txt").strip() == typed
    event = AuditEvent.objects.get(action="desktop.screen.actions", target=desktop.id)
    assert event.actor == f"system:desktop:{desktop.id}"
    assert event.detail["types"] == ["click", "type", "wait"]

    # Both tools offered to the model directly; each answer carried the screen as an image the model saw.
    tools = [tool["function"]["name"] for tool in scripted_model.requests[-3]["body"]["tools"]]
    assert {"screen_look", "screen_act"} <= set(tools)
    after_act, after_look = images_sent(scripted_model.requests[-2]), images_sent(scripted_model.requests[-1])
    assert [image.size for image in after_act] == [(1200, 750)]  # no wider than OpenClaw lets through
    assert [image.size for image in after_look][-1] == (640, 400)
    told = json.dumps(scripted_model.requests[-1]["body"]["messages"], ensure_ascii=False)
    assert "640x400 of the 1280x800 screen, scale 0.5" in told
