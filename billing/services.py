"""Billing's writes: tiers and credits (support staff), model prices (a workspace's admins), and the
periodic metering beat runs (disk measures, spend alerts)."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone
from django.utils.translation import gettext as _

from billing.metering import gib_hours, midnight, this_month
from billing.models import CreditGrant, DiskMeter, ModelPrice, SpendAlert, StorageDay, Subscription, Tier
from billing.selectors import meter_end, spend_this_month, tier_default, tier_of
from billing.signals import spend_threshold_reached
from desktops.audit import Actor, audit_record
from desktops.engines import desktop_disk_usage
from desktops.errors import Forbidden, Invalid, NotFound, QuotaExceeded
from desktops.models import Desktop, Role, Workspace
from desktops.models import DesktopState as S
from desktops.selectors import workspace_get

METER = Actor(system="billing")
# Percent of the monthly spend cap at which the workspace is warned, once a month each.
THRESHOLDS = (80, 100)


# Tiers and credits


def subscription_start(*, workspace: Workspace, owner) -> Subscription:
    """A new workspace goes on the default tier, recorded so that a later default does not move it.

    A tier without a fee is one person's to own FREE_WORKSPACES_PER_PERSON times: its quotas are per
    workspace, and workspaces cost nothing to make, so more of them would multiply the free quotas.
    """
    tier = tier_default()
    if tier.monthly_fee == 0:
        owned = Subscription.objects.filter(
            tier__monthly_fee=0, workspace__memberships__user=owner, workspace__memberships__role=Role.OWNER
        ).exclude(workspace=workspace)
        if owned.count() >= settings.FREE_WORKSPACES_PER_PERSON:
            raise QuotaExceeded(
                _(
                    "You own %(n)d workspace(s) on the %(tier)s tier already, as many as one person may: "
                    "move one to a paid tier, or work in the one you have."
                )
                % {"n": settings.FREE_WORKSPACES_PER_PERSON, "tier": tier.name}
            )
    subscription, _created = Subscription.objects.get_or_create(workspace=workspace, defaults={"tier": tier})
    return subscription


def subscription_set(*, actor: Actor, workspace_id: str, tier: Tier) -> Subscription:
    _ensure_support(actor)
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.OWNER)
    previous = tier_of(workspace)
    with transaction.atomic():
        subscription, _created = Subscription.objects.update_or_create(
            workspace=workspace, defaults={"tier": tier}
        )
        audit_record(
            actor=actor,
            action="billing.tier",
            workspace_id=workspace.id,
            target=workspace.id,
            previous=previous.name,
            tier=tier.name,
        )
    return subscription


def credit_grant(*, actor: Actor, workspace_id: str, amount: Decimal, reason: str) -> CreditGrant:
    _ensure_support(actor)
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.OWNER)
    if amount <= 0:
        raise Invalid(_("A credit is a positive amount."), fields={"amount": [_("Must be above zero.")]})
    with transaction.atomic():
        grant = CreditGrant.objects.create(
            workspace=workspace, amount=amount, reason=reason, granted_by=actor.label
        )
        audit_record(
            actor=actor,
            action="billing.credit",
            workspace_id=workspace.id,
            target=grant.id,
            amount=str(amount),
            reason=reason,
        )
    return grant


def _ensure_support(actor: Actor) -> None:
    if not (actor.support and actor.user is not None and actor.user.is_staff):
        raise Forbidden(_("Only support staff change a workspace's tier or grant it credits."))


# Model prices


def model_price_set(
    *,
    actor: Actor,
    workspace_id: str,
    model: str,
    input_per_million: Decimal,
    output_per_million: Decimal,
) -> ModelPrice:
    """Set what a model's tokens cost the workspace (its own keys), to price its agents' answers."""
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    model = model.strip()
    if not model:
        raise Invalid(_("Name the model."), fields={"model": [_("This field is required.")]})
    for field, value in (("inputPerMillion", input_per_million), ("outputPerMillion", output_per_million)):
        if value < 0:
            raise Invalid(_("A price cannot be negative."), fields={field: [_("Zero or more.")]})
    price, _created = ModelPrice.objects.update_or_create(
        workspace=workspace,
        model=model,
        defaults={"input_per_million": input_per_million, "output_per_million": output_per_million},
    )
    audit_record(
        actor=actor,
        action="billing.model_price",
        workspace_id=workspace.id,
        target=price.id,
        model=model,
        input_per_million=str(input_per_million),
        output_per_million=str(output_per_million),
    )
    return price


def model_price_delete(*, actor: Actor, workspace_id: str, price_id: str) -> None:
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    if not workspace.model_prices.filter(id=price_id).delete()[0]:
        raise NotFound(_("Model price %(id)s not found.") % {"id": price_id})
    audit_record(actor=actor, action="billing.model_price_delete", workspace_id=workspace.id, target=price_id)


# Metering, run by beat


def billing_meter() -> dict:
    """Beat's periodic billing work: measure the disks, then warn the workspaces near their cap."""
    return {"disks": storage_sample(), "alerts": [a.id for a in spend_alerts_record()]}


def storage_sample() -> int:
    """Measure every live desktop's disk and count what each held since its last measure.

    A desktop its engine cannot measure now (a stopped LXC desktop's disk is not mounted) keeps
    its last measure; a destroyed one counts until its destruction, then no more. Returns how many
    desktops were counted.
    """
    unclosed = Q(state=S.DESTROYED, disk_meter__counted_until__lt=F("state_changed_at"))
    counted = 0
    for desktop in Desktop.objects.filter(~Q(state=S.DESTROYED) | unclosed).iterator():
        measured = None if desktop.state == S.DESTROYED else desktop_disk_usage(desktop)
        counted += _count_disk(desktop, measured, timezone.now())
    return counted


def _count_disk(desktop: Desktop, measured: int | None, now: datetime) -> bool:
    if measured is None and not DiskMeter.objects.filter(desktop=desktop).exists():
        return False  # never measured yet: nothing to hold
    with transaction.atomic():
        meter, created = DiskMeter.objects.select_for_update().get_or_create(
            desktop=desktop, defaults={"bytes": measured, "measured_at": now, "counted_until": now}
        )
        if created:
            return True
        until = meter_end(desktop, now)
        for day, value in gib_hours(meter.bytes, meter.counted_until, until):
            row, _created = StorageDay.objects.get_or_create(desktop=desktop, day=day)
            StorageDay.objects.filter(pk=row.pk).update(gib_hours=F("gib_hours") + value)
        meter.counted_until = max(meter.counted_until, until)
        if measured is not None:
            meter.bytes, meter.measured_at = measured, now
        meter.save()
    return True


def spend_alerts_record() -> list[SpendAlert]:
    """Record each workspace's spend reaching 80 % and 100 % of its cap, once a month and threshold."""
    month = this_month()
    # Workspaces with a desktop alive now, or one that changed this month (destroyed since, say).
    live = [state for state in S if state != S.DESTROYED]
    active = Q(desktops__state__in=live) | Q(desktops__state_changed_at__gte=midnight(month))
    recorded = []
    for workspace in Workspace.objects.filter(active).distinct():
        cap = tier_of(workspace).monthly_spend_cap
        if not cap:
            continue
        spend = spend_this_month(workspace)
        for threshold in THRESHOLDS:
            if spend * 100 < cap * threshold:
                break
            alert, created = SpendAlert.objects.get_or_create(
                workspace=workspace,
                month=month,
                threshold=threshold,
                defaults={"spend": spend.quantize(Decimal("0.01")), "cap": cap},
            )
            if created:
                audit_record(
                    actor=METER,
                    action="billing.spend_alert",
                    workspace_id=workspace.id,
                    target=alert.id,
                    threshold=threshold,
                    spend=str(alert.spend),
                    cap=str(cap),
                )
                spend_threshold_reached.send(sender=SpendAlert, alert=alert)
                recorded.append(alert)
    return recorded
