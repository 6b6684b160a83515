"""The tier's quotas, checked where desktops are made, started and resumed (and, on a free tier, that an
owner of the workspace has confirmed their e-mail address).

Each check locks the workspace's row for the rest of the caller's transaction: concurrent creates
and starts of one workspace queue there until the one ahead commits, so each counts the desktops
the others made or started and none slips past a quota.
"""

from __future__ import annotations

from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from billing.money import euros
from billing.selectors import QuotaUsage, confirmation_awaited, quota_usage
from desktops.errors import QuotaExceeded, Unconfirmed
from desktops.models import Desktop, Plan, Workspace

# The actions that make a desktop run again.
STARTS = {"start", "resume"}


def quota_check_create(*, workspace: Workspace, plan: Plan, count: int = 1) -> None:
    """Refuse `count` new desktops of `plan` past the tier's quotas, all of them or none; call inside the
    creating transaction."""
    usage = _locked(workspace.id)
    tier, desktops, disk = usage.tier.name, usage.desktops, usage.disk_gib
    if desktops.used + count > desktops.limit:
        words = {"used": desktops.used, "limit": desktops.limit, "tier": tier, "count": count}
        if count == 1:
            raise QuotaExceeded(
                ngettext(
                    "%(used)d of %(limit)d desktop on the %(tier)s tier: destroy one to make another.",
                    "%(used)d of %(limit)d desktops on the %(tier)s tier: destroy one to make another.",
                    desktops.limit,
                )
                % words
            )
        raise QuotaExceeded(
            _(
                "%(used)d of %(limit)d desktops on the %(tier)s tier: %(count)d more would go past it; "
                "none made."
            )
            % words
        )
    if disk.used + count * plan.disk_gib > disk.limit:
        words = {"used": disk.used, "limit": disk.limit, "tier": tier, "plan": plan, "count": count}
        raise QuotaExceeded(
            ngettext(
                "%(used)d of %(limit)d GiB of disk on the %(tier)s tier: "
                "a %(plan)s desktop needs %(needed)d GiB more.",
                "%(used)d of %(limit)d GiB of disk on the %(tier)s tier: "
                "%(count)d %(plan)s desktops need %(needed)d GiB more; none made.",
                count,
            )
            % {**words, "needed": count * plan.disk_gib}
        )
    _check_running_and_spend(usage, count)


def quota_check_action(*, desktop: Desktop, action: str) -> None:
    """Refuse to start or resume a desktop past the tier's quotas; call inside the step's transaction."""
    if action in STARTS:
        _check_running_and_spend(_locked(desktop.workspace_id, exclude=desktop.id))


def _locked(workspace_id: str, exclude: str = "") -> QuotaUsage:
    workspace = Workspace.objects.select_for_update().get(id=workspace_id)
    if confirmation_awaited(workspace=workspace):
        raise Unconfirmed(
            _(
                "Desktops run on this tier once an owner of the workspace has confirmed their e-mail "
                "address: follow the link in the e-mail sent at sign-up (Mission Control sends another)."
            )
        )
    return quota_usage(workspace=workspace, exclude=exclude)


def _check_running_and_spend(usage: QuotaUsage, count: int = 1) -> None:
    tier, running, spend = usage.tier.name, usage.running, usage.spend
    if running.used + count > running.limit:
        words = {"used": running.used, "limit": running.limit, "tier": tier, "count": count}
        if count == 1:
            raise QuotaExceeded(
                ngettext(
                    "%(used)d of %(limit)d running desktop on the %(tier)s tier: stop or suspend one first.",
                    "%(used)d of %(limit)d running desktops on the %(tier)s tier: stop or suspend one first.",
                    running.limit,
                )
                % words
            )
        # New desktops run as soon as they are made.
        raise QuotaExceeded(
            _(
                "%(used)d of %(limit)d running desktops on the %(tier)s tier: %(count)d new ones would "
                "go past it; none made."
            )
            % words
        )
    if spend.limit is not None and spend.used >= spend.limit:
        raise QuotaExceeded(
            _(
                "%(spent)s of the %(cap)s monthly spend cap on the %(tier)s tier: "
                "no desktop starts until next month."
            )
            % {"spent": euros(spend.used), "cap": euros(spend.limit), "tier": tier}
        )
