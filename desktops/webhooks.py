"""A workspace's webhook: every request for approval and every answer, every alert raised and
acknowledged, POSTed as JSON to the URL its admins gave, signed, retried with backoff, and logged
delivery by delivery.

Signature: `X-LeBureau-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">` under the
workspace's webhook secret, with the timestamp in `X-LeBureau-Timestamp` (a receiver refuses old ones,
so a captured call cannot be replayed later). The webhook never reaches private, loopback or link-local
addresses (the host's services, cloud metadata) unless WEBHOOK_ALLOW_PRIVATE says so.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
import socket
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

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
# What a receiver answers is kept this long in the log, at most.
KEPT_ERROR = 500


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
    enqueue(WEBHOOK_DELIVER, delivery_id=delivery.id)
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
    request = urllib.request.Request(  # noqa: S310 (http(s) only: _check_url)
        delivery.url,
        data=body,
        method="POST",
        headers={
            "Content-Type": "application/json",
            "User-Agent": "LeBureau-Webhook/1",
            "X-LeBureau-Event": delivery.event,
            "X-LeBureau-Delivery": delivery.id,
            "X-LeBureau-Timestamp": stamp,
            "X-LeBureau-Signature": f"sha256={signature}",
        },
    )
    status, error = None, ""
    try:
        _check_url(delivery.url, field="url")
        with urllib.request.urlopen(request, timeout=settings.WEBHOOK_TIMEOUT) as response:  # noqa: S310
            status = response.status
    except urllib.error.HTTPError as exc:
        status, error = exc.code, exc.read(KEPT_ERROR).decode(errors="replace")
    except (OSError, Invalid) as exc:
        error = getattr(exc, "message", None) or str(exc)
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


def _check_url(url: str, *, field: str) -> None:
    """http(s), and (unless allowed) no address of the host, its private networks or cloud metadata."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        message = _("Give an http:// or https:// address.")
        raise Invalid(message, fields={field: [message]})
    if settings.WEBHOOK_ALLOW_PRIVATE:
        return
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(parts.hostname, parts.port or 443)}
    except OSError as exc:
        message = _("%(host)s cannot be resolved.") % {"host": parts.hostname}
        raise Invalid(message, fields={field: [message]}) from exc
    for address in addresses:
        if not ipaddress.ip_address(address.split("%")[0]).is_global:
            message = _("A webhook may not point at a private, loopback or link-local address.")
            raise Invalid(message, fields={field: [message]})
