"""A workspace's webhook: every request for approval and every answer, every alert raised and
acknowledged, POSTed as JSON to the URL its admins gave, signed, retried with backoff, and logged
delivery by delivery.

Signature: `X-LeBureau-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">` under the
workspace's webhook secret, with the timestamp in `X-LeBureau-Timestamp` (a receiver refuses old ones,
so a captured call cannot be replayed later).

A webhook never reaches private, loopback or link-local addresses (the host's services, cloud metadata),
save the networks WEBHOOK_ALLOWED_NETWORKS names. Its name is resolved once per attempt and the call goes
to the address that was checked (a name that answers public, then private, gains nothing); redirects
are not followed; and of the receiver's answer only the status is kept, so a delivery log shows a
tenant nothing of what answered.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
import socket
import time
from urllib.parse import SplitResult, urlsplit

import urllib3
from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.translation import gettext as _

from desktops import crypto
from desktops.audit import Actor, audit_record
from desktops.errors import Invalid
from desktops.models import Role, WebhookDelivery, Workspace
from desktops.queue import WEBHOOK_DELIVER, enqueue
from desktops.selectors import workspace_get

Status = WebhookDelivery.Status
# Why an attempt failed is kept this long in the log, at most.
KEPT_ERROR = 500
# IPv6 forms that carry an IPv4 address (mapped, compatible, NAT64, 6to4, Teredo): a gateway on the way
# delivers them to that address, whatever `is_global` says of the IPv6 one.
EMBEDDING_IPV4 = tuple(
    ipaddress.ip_network(prefix)
    for prefix in ("::ffff:0:0/96", "::/96", "64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "2001::/32")
)


class DeliveryFailed(Exception):
    """This attempt did not get a 2xx answer; worth another later."""


def webhook_set(
    *, actor: Actor, workspace_id: str, url: str, rotate_secret: bool = False
) -> tuple[Workspace, str]:
    """Where the workspace's events go (blank: nowhere). A signing secret is made with the first URL, or
    anew when asked; returned that once (empty otherwise), never shown again."""
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    if url:
        _check_url(url, field="url")
    secret = ""
    if rotate_secret or (url and not workspace.webhook_secret_encrypted):
        secret = "whsec_" + secrets.token_urlsafe(32)
        workspace.webhook_secret_encrypted = crypto.secret_encrypt(secret)
    workspace.approval_webhook_url = url
    workspace.save(update_fields=["approval_webhook_url", "webhook_secret_encrypted"])
    audit_record(
        actor=actor,
        action="workspace.webhook",
        workspace_id=workspace.id,
        target=workspace.id,
        url=url,
        new_secret=bool(secret),
    )
    return workspace, secret


def webhook_deliveries(*, actor: Actor, workspace_id: str) -> QuerySet[WebhookDelivery]:
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    return workspace.webhook_deliveries.all()


def webhook_notify(*, workspace_id: str, event: str, payload: dict) -> WebhookDelivery | None:
    """Queue the event for the workspace's webhook, if it has one (sent once the transaction commits)."""
    url = Workspace.objects.filter(id=workspace_id).values_list("approval_webhook_url", flat=True).first()
    if not url:
        return None
    delivery = WebhookDelivery.objects.create(
        workspace_id=workspace_id, event=event, url=url, payload=payload
    )
    enqueue(WEBHOOK_DELIVER, delivery_id=delivery.id, workspace_id=workspace_id)
    return delivery


def webhook_attempt(*, delivery_id: str, last: bool) -> None:
    """Send a pending delivery once. Raises DeliveryFailed to be tried again, unless this was the
    `last` attempt: then the delivery is marked failed."""
    delivery = WebhookDelivery.objects.select_related("workspace").filter(id=delivery_id).first()
    if delivery is None or delivery.status != Status.PENDING:
        return
    body = json.dumps(
        {
            "id": delivery.id,
            "event": delivery.event,
            "createdAt": delivery.created_at.isoformat(),
            **delivery.payload,
        }
    ).encode()
    stamp = str(int(time.time()))
    secret = crypto.secret_decrypt(delivery.workspace.webhook_secret_encrypted)
    signature = hmac.new(secret.encode(), stamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "LeBureau-Webhook/1",
        "X-LeBureau-Event": delivery.event,
        "X-LeBureau-Delivery": delivery.id,
        "X-LeBureau-Timestamp": stamp,
        "X-LeBureau-Signature": f"sha256={signature}",
    }
    status, error = None, ""
    try:
        status = _post(delivery.url, body, headers)
    except Invalid as exc:
        error = exc.message
    except (OSError, urllib3.exceptions.HTTPError) as exc:
        error = str(exc)
    if status is not None and 300 <= status < 400:
        error = _("The receiver answered with a redirect, and webhooks follow none: give its final address.")
    delivered = status is not None and 200 <= status < 300
    with transaction.atomic():
        WebhookDelivery.objects.filter(id=delivery.id).update(
            attempts=delivery.attempts + 1,
            response_status=status,
            last_error=error[:KEPT_ERROR],
            status=Status.DELIVERED if delivered else Status.FAILED if last else Status.PENDING,
            delivered_at=timezone.now() if delivered else None,
        )
    if not delivered and not last:
        raise DeliveryFailed(f"{delivery.url} answered {status or error}")


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    """POST to the address the URL's name was checked at (never resolved again), following no redirect;
    the status of the answer, whose body is not read."""
    parts, address = _check_url(url, field="url")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    options = {
        "port": parts.port,
        "timeout": urllib3.Timeout(connect=settings.WEBHOOK_TIMEOUT, read=settings.WEBHOOK_TIMEOUT),
        "retries": False,
    }
    pool_class = urllib3.HTTPConnectionPool
    if parts.scheme == "https":
        # The certificate is checked against the name, while the connection goes to the address.
        pool_class = urllib3.HTTPSConnectionPool
        options.update(server_hostname=parts.hostname, assert_hostname=parts.hostname)
    with pool_class(address, **options) as pool:
        response = pool.urlopen(
            "POST",
            parts._replace(scheme="", netloc="").geturl() or "/",
            body=body,
            headers={**headers, "Host": f"{host}:{parts.port}" if parts.port else host},
            redirect=False,
            preload_content=False,
        )
        response.release_conn()
        return response.status


def _check_url(url: str, *, field: str) -> tuple[SplitResult, str]:
    """http(s), and an address that is neither the host's, nor of its private networks or cloud metadata
    (save the allowed networks): the URL's parts and the address to connect to."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        message = _("Give an http:// or https:// address.")
        raise Invalid(message, fields={field: [message]})
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        found = socket.getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
    except (OSError, ValueError) as exc:
        message = _("%(host)s cannot be resolved.") % {"host": parts.hostname}
        raise Invalid(message, fields={field: [message]}) from exc
    addresses = [info[4][0] for info in found]
    # Every address the name has must pass: a resolver may hand any of them out next time.
    if not all(_reachable(ipaddress.ip_address(address.split("%")[0])) for address in addresses):
        message = _("A webhook may not point at a private, loopback or link-local address.")
        raise Invalid(message, fields={field: [message]})
    return parts, addresses[0]


def _reachable(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if any(address in network for network in settings.WEBHOOK_ALLOWED_NETWORKS):
        return True
    embedding = address.version == 6 and any(address in network for network in EMBEDDING_IPV4)
    return address.is_global and not address.is_multicast and not embedding
