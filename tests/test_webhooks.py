"""Approval events sent to a workspace's webhook by the real Celery worker: signed, retried with backoff
until the receiver takes them, logged; set by admins only, and never aimed at the host's own or private
addresses: not through a redirect, a name that answers another address the next time, an IPv6 form of
an IPv4 one, nor by reading what an internal service answered."""

import hashlib
import hmac
import ipaddress
import json
import socket
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


LOOPBACK = [ipaddress.ip_network("127.0.0.1/32")]


class Receiver:
    """A webhook receiver on loopback answering the given statuses in turn (then 200), keeping each call;
    with a `location` for redirects and a `body` for what an internal service would answer."""

    def __init__(self, *statuses: int, host="127.0.0.1", port=0, location="", body=b""):
        self.statuses, self.calls = list(statuses), []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.calls.append((self.headers, body))  # its lookups ignore case
                self.send_response(receiver.statuses.pop(0) if receiver.statuses else 200)
                if location:
                    self.send_header("Location", location)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://{host}:{self.port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    made = []
    yield lambda *statuses, **options: made.append(Receiver(*statuses, **options)) or made[-1]
    for one in made:
        one.close()


def set_webhook(client, workspace, url: str):
    return client.put(f"/api/workspaces/{workspace.id}/webhook", {"url": url}, format="json")


def admin_sets(members, workspace, url: str) -> WebhookDelivery:
    """The webhook set by an admin, and one delivery for it that this test attempts (no worker's)."""
    webhooks.webhook_set(actor=Actor(user=members[Role.ADMIN].user), workspace_id=workspace.id, url=url)
    return unsent(workspace, url)


def unsent(workspace, url: str) -> WebhookDelivery:
    return WebhookDelivery.objects.create(
        workspace=workspace, event="approval.requested", url=url, payload={}
    )


def test_a_request_reaches_the_webhook_signed_after_a_failed_attempt(
    celery_worker, members, workspace, receiver, settings
):
    settings.WEBHOOK_ALLOWED_NETWORKS = LOOPBACK
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
    settings.WEBHOOK_ALLOWED_NETWORKS = LOOPBACK
    hook = receiver(503)
    delivery = admin_sets(members, workspace, hook.url)
    webhooks.webhook_attempt(delivery_id=delivery.id, last=True)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.response_status) == ("failed", 1, 503)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:5432/",
        "http://169.254.169.254/latest/meta-data/",
        "http://10.0.0.1/",
        # IPv6 forms of the metadata address, which `is_global` calls public: NAT64, 6to4, mapped, Teredo.
        "http://[64:ff9b::a9fe:a9fe]/latest/meta-data/",
        "http://[2002:a9fe:a9fe::1]/",
        "http://[::ffff:169.254.169.254]/",
        "http://[2001:0:4136:e378:8000:63bf:5601:5601]/",
        "ftp://example.com/",
    ],
)
def test_a_webhook_never_points_at_the_host_or_private_networks(members, workspace, url):
    refused = set_webhook(client_for(members[Role.OWNER]), workspace, url)
    assert refused.status_code == 400, refused.content
    workspace.refresh_from_db()
    assert workspace.approval_webhook_url == ""


def test_a_redirect_to_an_internal_address_is_not_followed(members, workspace, receiver, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = LOOPBACK
    internal = receiver(host="127.0.0.2")  # a service of the host's network, which the webhook may not reach
    hook = receiver(302, location=internal.url)
    delivery = admin_sets(members, workspace, hook.url)
    webhooks.webhook_attempt(delivery_id=delivery.id, last=True)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.response_status) == ("failed", 302)
    assert "redirect" in delivery.last_error
    assert len(hook.calls) == 1 and internal.calls == []


def test_a_name_is_called_at_the_address_it_was_checked_at(
    members, workspace, receiver, settings, monkeypatch
):
    """DNS rebinding: a name that answers an allowed address while it is checked, then an internal one."""
    settings.WEBHOOK_ALLOWED_NETWORKS = LOOPBACK
    hook = receiver()
    internal = receiver(host="127.0.0.2", port=hook.port)
    system_resolve, asked = socket.getaddrinfo, []

    # A stand-in for the attacker's DNS server with a TTL of 0 (the host's resolver is not ours to point
    # elsewhere): the checking resolutions, the webhook's set and its attempt's, get the allowed address,
    # any later one the internal address.
    def rebinding(host, port, *args, **kwargs):
        if host != "rebind.example":
            return system_resolve(host, port, *args, **kwargs)
        asked.append(host)
        address = "127.0.0.1" if len(asked) <= 2 else "127.0.0.2"
        return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    delivery = admin_sets(members, workspace, f"http://rebind.example:{hook.port}/hook")
    webhooks.webhook_attempt(delivery_id=delivery.id, last=True)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.response_status) == ("delivered", 200)
    assert len(asked) == 2 and len(hook.calls) == 1 and internal.calls == []
    assert hook.calls[0][0]["Host"] == f"rebind.example:{hook.port}"
    # Had the name answered the internal address at the attempt, nothing would have been sent.
    delivery = unsent(workspace, f"http://rebind.example:{hook.port}/hook")
    webhooks.webhook_attempt(delivery_id=delivery.id, last=True)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.response_status) == ("failed", None)
    assert internal.calls == []


def test_what_a_receiver_answers_is_not_shown_to_the_tenant(members, workspace, receiver, settings):
    settings.WEBHOOK_ALLOWED_NETWORKS = LOOPBACK
    page = b"<h1>pve-internal</h1> PostgreSQL 16 on 10.0.0.5"  # what an internal service might answer
    hook = receiver(500, body=page)
    delivery = admin_sets(members, workspace, hook.url)
    webhooks.webhook_attempt(delivery_id=delivery.id, last=True)
    delivery.refresh_from_db()
    assert (delivery.status, delivery.response_status, delivery.last_error) == ("failed", 500, "")
    log = client_for(members[Role.ADMIN]).get(f"/api/workspaces/{workspace.id}/webhook/deliveries")
    assert log.status_code == 200 and b"pve-internal" not in log.content


def test_only_admins_set_or_read_the_webhook(members, workspace):
    member = client_for(members[Role.MEMBER])
    assert set_webhook(member, workspace, "https://example.com/hook").status_code == 403
    assert member.get(f"/api/workspaces/{workspace.id}/webhook/deliveries").status_code == 403
    outsider = client_for(members["outsider"])
    assert outsider.get(f"/api/workspaces/{workspace.id}/webhook").status_code == 404
