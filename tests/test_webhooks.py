"""Approval events sent to a workspace's webhook by the real Celery worker: signed, retried with backoff
until the receiver takes them, logged; set by admins only, and never aimed at the host's own or private
addresses."""

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from desktops import approvals, webhooks
from desktops.audit import Actor
from desktops.models import Role, WebhookDelivery
from tests.conftest import client_for
from tests.factories import DesktopFactory

pytestmark = pytest.mark.django_db(transaction=True)


class Receiver:
    """A webhook receiver on loopback answering the given statuses in turn (then 200), keeping each call."""

    def __init__(self, *statuses: int):
        self.statuses, self.calls = list(statuses), []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.calls.append((self.headers, body))  # its lookups ignore case
                self.send_response(receiver.statuses.pop(0) if receiver.statuses else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    made = []
    yield lambda *statuses: made.append(Receiver(*statuses)) or made[-1]
    for one in made:
        one.close()


def set_webhook(client, workspace, url: str):
    return client.put(f"/api/workspaces/{workspace.id}/webhook", {"url": url}, format="json")


def test_a_request_reaches_the_webhook_signed_after_a_failed_attempt(
    celery_worker, members, workspace, receiver, settings
):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    hook = receiver(500)
    answer = set_webhook(client_for(members[Role.ADMIN]), workspace, hook.url)
    assert answer.status_code == 200, answer.content
    secret = answer.json()["secret"]
    assert secret.startswith("whsec_")
    # The secret is shown once.
    assert (
        client_for(members[Role.ADMIN]).get(f"/api/workspaces/{workspace.id}/webhook").json()["secret"] == ""
    )

    desktop = DesktopFactory(workspace=workspace, state="running", name="deployer")
    asked = approvals.approval_request(desktop=desktop, title="terraform apply")
    deadline = time.monotonic() + 30
    while not WebhookDelivery.objects.filter(workspace=workspace, status="delivered").exists():
        assert time.monotonic() < deadline, list(
            WebhookDelivery.objects.values("status", "attempts", "last_error")
        )
        time.sleep(0.2)
    delivery = WebhookDelivery.objects.get(workspace=workspace)
    assert (delivery.event, delivery.attempts, delivery.response_status) == ("approval.requested", 2, 200)
    assert len(hook.calls) == 2
    headers, body = hook.calls[-1]
    expected = hmac.new(
        secret.encode(), headers["X-LeBureau-Timestamp"].encode() + b"." + body, hashlib.sha256
    )
    assert headers["X-LeBureau-Signature"] == f"sha256={expected.hexdigest()}"
    sent = json.loads(body)
    assert (sent["event"], sent["approval"]["id"], sent["approval"]["desktopName"]) == (
        "approval.requested",
        asked.id,
        "deployer",
    )
    log = client_for(members[Role.ADMIN]).get(f"/api/workspaces/{workspace.id}/webhook/deliveries").json()
    assert [(d["event"], d["status"], d["attempts"]) for d in log["results"]] == [
        ("approval.requested", "delivered", 2)
    ]


def test_a_delivery_out_of_attempts_is_logged_failed(members, workspace, receiver, settings):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    hook = receiver(503)
    webhooks.webhook_set(actor=Actor(user=members[Role.ADMIN].user), workspace_id=workspace.id, url=hook.url)
    delivery = webhooks.webhook_notify(workspace_id=workspace.id, event="approval.requested", payload={})
    webhooks.webhook_attempt(delivery_id=delivery.id, last=True)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_status) == ("failed", 1, 503)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:5432/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        "ftp://example.com/",
    ],
)
def test_a_webhook_never_points_at_the_host_or_private_networks(members, workspace, url):
    refused = set_webhook(client_for(members[Role.OWNER]), workspace, url)
    assert refused.status_code == 400, refused.content
    workspace.refresh_from_db()
    assert workspace.approval_webhook_url == ""


def test_only_admins_set_or_read_the_webhook(members, workspace):
    member = client_for(members[Role.MEMBER])
    assert set_webhook(member, workspace, "https://example.com/hook").status_code == 403
    assert member.get(f"/api/workspaces/{workspace.id}/webhook/deliveries").status_code == 403
    outsider = client_for(members["outsider"])
    assert outsider.get(f"/api/workspaces/{workspace.id}/webhook").status_code == 404
