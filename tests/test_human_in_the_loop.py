"""The operator in the loop, on real LXC desktops: a running turn stopped from outside, its processes
with it; the guest endpoint, the one part of the control plane a desktop reaches; an agent asking for
approval with `bureau approve` and getting the operator's decision. The only double is the model: the
scripted OpenAI-compatible server on the test bridge.
"""

import shlex
import time

import pytest

from desktops.approvals import desktop_by_token
from desktops.models import Approval, AuditEvent, ChatMessage
from desktops.selectors import chat_content
from tests.conftest import GUEST_URL, LXC_IMAGE, SCRIPTED_MODEL_HOST, web_server
from tests.support.agent_loop import Asking, install_agent, turn_processes, wait_for
from tests.support.desktops import act, provision, run, wait_for_state
from tests.support.scripted_model import Text

pytestmark = [
    pytest.mark.lxc,
    pytest.mark.worker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not LXC_IMAGE.is_file(), reason="no golden image (make setup builds it)"),
]


def chat(api, desktop, message: str) -> dict:
    response = api.post(f"/api/desktops/{desktop.id}/chat", {"message": message}, format="json")
    assert response.status_code == 202, response.content
    return response.json()


def test_a_long_turn_is_stopped_with_its_processes_and_the_queue_moves_on(lxc_api, workspace, scripted_model):
    desktop = provision(lxc_api, "stopped-turn")
    install_agent(desktop, workspace)
    long_answer = " ".join(f"mot{i}" for i in range(400))
    scripted_model.script(Text(long_answer, pace=0.2), Text("Deuxième réponse."))

    first = chat(lxc_api, desktop, "Write a very long answer")
    second = chat(lxc_api, desktop, "Et ensuite une courte")
    wait_for(lambda: "mot3" in chat_content(ChatMessage.objects.get(id=first["id"])), "no answer streamed")
    assert "turn-daemon" in turn_processes(desktop, first["id"])

    response = lxc_api.post(f"/api/desktops/{desktop.id}/chat/{first['id']}/cancel")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "cancelled" and response.json()["content"].startswith("mot0")

    # Every process of the turn is gone from the desktop: the agent, its tool and its daemon.
    wait_for(
        lambda: turn_processes(desktop, first["id"]) == "",
        lambda: f"the turn's processes live on: {run(desktop, 'ps -eo pid,ppid,sid,user,cmd')}",
    )
    # The turn ends cancelled, with what was said before the stop, and the next message gets its answer.
    answer = wait_for(
        lambda: ChatMessage.objects.filter(id=second["id"], status="done").first(),
        "the queue did not move on",
    )
    assert answer.content == "Deuxième réponse."
    stopped = ChatMessage.objects.get(id=first["id"])
    assert (
        stopped.status == "cancelled"
        and stopped.content.startswith("mot0")
        and "mot399" not in stopped.content
    )


# From inside a desktop: what an HTTP GET of a URL answers (the status, or why there was none).
FETCH = """
import sys, urllib.error, urllib.request
token = open("/etc/bureau/token").read().strip()
request = urllib.request.Request(sys.argv[1], headers={"Authorization": "Bearer " + token})
try:
    print(urllib.request.urlopen(request, timeout=3).status)
except urllib.error.HTTPError as exc:
    print(exc.code)
except OSError as exc:
    print("unreachable", type(exc).__name__)
"""


def fetch_from(desktop, url: str) -> str:
    return run(desktop, f"python3 -c {shlex.quote(FETCH)} {shlex.quote(url)}").strip()


def test_a_desktop_reaches_the_guest_endpoint_and_no_other_part_of_the_control_plane(
    lxc_api, guest_endpoint, driver_dir, tmp_path_factory
):
    desktop = provision(lxc_api, "guest-door")
    assert run(desktop, "cat /etc/bureau/guest_url").strip() == GUEST_URL
    assert fetch_from(desktop, f"{GUEST_URL}/v1/desktop") == "200"
    # The guest listener has no pages, API or admin to offer.
    assert fetch_from(desktop, f"{GUEST_URL}/api/desktops") == "404"
    assert fetch_from(desktop, f"{GUEST_URL}/admin/") == "404"
    # Mission Control and the API, served on the desktops' side of the host, stay out of their reach.
    basetemp = tmp_path_factory.getbasetemp()
    with web_server(
        driver_dir, basetemp, host=SCRIPTED_MODEL_HOST, ALLOWED_HOSTS=SCRIPTED_MODEL_HOST
    ) as site:
        assert fetch_from(desktop, f"{site}/api/desktops").startswith("unreachable")
    # Destroyed, the desktop's token is void: whoever kept a copy can no longer use it.
    token = run(desktop, "cat /etc/bureau/token").strip()
    assert desktop_by_token(token).id == desktop.id
    act(lxc_api, desktop.id, "destroy")
    assert wait_for_state(desktop.id, "destroyed", timeout=60).agent_token_hash == ""
    assert desktop_by_token(token) is None


def pending_request(desktop, title: str) -> Approval:
    return wait_for(
        lambda: Approval.objects.filter(desktop=desktop, title=title, status="pending").first(),
        f"no request {title!r} arrived",
    )


def test_bureau_approve_waits_for_the_operators_decision(lxc_api, guest_endpoint):
    desktop = provision(lxc_api, "asks-first")

    asking = Asking(
        desktop, "--title 'Déployer en prod' --details - --timeout 5m", stdin="kubectl apply -f prod/"
    )
    request = pending_request(desktop, "Déployer en prod")
    assert (request.details, request.cwd) == ("kubectl apply -f prod/", "/tmp")
    # The agent waits: nothing is decided until a person is.
    time.sleep(1.5)
    assert asking.status is None
    listed = lxc_api.get(f"/api/approvals?workspace={desktop.workspace_id}&status=pending").json()["results"]
    assert [a["id"] for a in listed] == [request.id] and listed[0]["desktopName"] == "asks-first"
    approved = lxc_api.post(f"/api/approvals/{request.id}/approve", {"comment": "Vas-y."}, format="json")
    assert approved.status_code == 200, approved.content
    assert asking.result() == (0, "Vas-y.\n")

    asking = Asking(desktop, "--title 'Supprimer la base'")
    request = pending_request(desktop, "Supprimer la base")
    denied = lxc_api.post(f"/api/approvals/{request.id}/deny", {"comment": "Surtout pas."}, format="json")
    assert denied.status_code == 200, denied.content
    assert asking.result() == (1, "Surtout pas.\n")

    asking = Asking(desktop, "--title 'Acheter un domaine' --timeout 3s")
    request = pending_request(desktop, "Acheter un domaine")
    assert asking.result()[0] == 2
    assert Approval.objects.get(id=request.id).status == "expired"
    # Too late: the request timed out, and no answer changes that.
    late = lxc_api.post(f"/api/approvals/{request.id}/approve", {}, format="json")
    assert late.status_code == 409, late.content

    trail = AuditEvent.objects.filter(workspace_id=desktop.workspace_id, action__startswith="approval.")
    assert sorted(trail.values_list("action", flat=True)) == sorted(
        ["approval.request"] * 3 + ["approval.approved", "approval.denied", "approval.expired"]
    )
    assert (
        trail.get(action="approval.request", detail__title="Déployer en prod").actor
        == f"system:desktop:{desktop.id}"
    )
