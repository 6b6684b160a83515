"""Alerts: rules evaluated periodically over every live desktop, each raising an alert its operators see
live in Mission Control, are told of (e-mail, the workspace's webhook), and acknowledge.

The rules: a desktop in `error`; a step stuck past its deadline; memory, CPU or disk above a share of the
plan's caps for a while; the agent runtime failing a turn or no longer followed; unusual activity (a
burst of commands run by the agent, a burst of blocked egress attempts, a turn running far longer than
usual). Each finding names its cause (this stay in `error`, this failed turn, this spell above a
threshold): the database keeps one open alert per rule and desktop, and one alert per cause, so an
acknowledged cause is not raised again. The open alerts of a destroyed desktop are resolved: nobody can
see to them any more.

The commands are those the agent runtime reports through the guest endpoint (OpenClaw: our plugin's
`before_tool_call` hook, for every `exec`, in batches), added to a count per desktop of which each
evaluation makes a rate, as it does of the engine's counts of blocked attempts.
"""

from __future__ import annotations

import statistics
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.mail import send_mass_mail
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F, Q, QuerySet
from django.db.models.functions import Coalesce
from django.urls import reverse
from django.utils import timezone
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from desktops.agent_failures import failure_of
from desktops.audit import SYSTEM, Actor, audit_record
from desktops.egress_blocked import blocked_attempts_record
from desktops.engines import desktop_disk_usage, desktop_resource_usage
from desktops.errors import Conflict, Invalid, NotFound
from desktops.events import AlertChanged, publish_alert_change
from desktops.lifecycle import STEPS_BY_VIA, step_waiting_since
from desktops.models import Alert, AlertWatch, ChatMessage, Desktop, DesktopState, Role, Workspace
from desktops.queue import ALERT_EMAIL, enqueue
from desktops.selectors import member_emails, workspace_for_control, workspace_get, workspaces_visible
from desktops.webhooks import webhook_notify

Kind, Status = Alert.Kind, Alert.Status
MIB, GIB = 1024**2, 1024**3


@dataclass(frozen=True)
class Threshold:
    label: str
    default: int
    low: int
    high: int


# When a workspace's alerts fire, unless its admins chose otherwise.
THRESHOLDS = {
    "memory_percent": Threshold(gettext_lazy("Memory, % of the plan's"), 90, 1, 100),
    "cpu_percent": Threshold(gettext_lazy("CPU, % of the plan's"), 90, 1, 100),
    "disk_percent": Threshold(gettext_lazy("Disk, % of the plan's"), 90, 1, 100),
    "sustained_seconds": Threshold(gettext_lazy("For at least (seconds)"), 300, 0, 86400),
    "blocked_per_minute": Threshold(gettext_lazy("Blocked connections per minute"), 30, 1, 100000),
    # An agent waits for its model between two commands: one a second, held for an evaluation, is a loop.
    "commands_per_minute": Threshold(gettext_lazy("Commands run by the agent per minute"), 60, 1, 100000),
    "long_turn_factor": Threshold(gettext_lazy("A turn runs N times longer than usual"), 5, 2, 100),
    "long_turn_minimum": Threshold(gettext_lazy("…and at least (seconds)"), 1800, 60, 7 * 86400),
}
# Turns that ended before this are history: a rule never raises an alert for them.
RECENT = timedelta(days=1)
# How many of a workspace's answered turns make "usual".
USUAL_TURNS = 50
# A turn nobody has followed for this many times CHAT_STALE_AFTER: its agent no longer answers.
SILENT_AFTER = 10


def thresholds_of(workspace: Workspace) -> dict[str, int]:
    chosen = workspace.alert_thresholds or {}
    return {name: int(chosen.get(name, t.default)) for name, t in THRESHOLDS.items()}


def alert_thresholds_set(*, actor: Actor, workspace_id: str, thresholds: dict) -> Workspace:
    """Change some of the workspace's thresholds (admins); those left out keep their value."""
    workspace = workspace_get(actor=actor, workspace_id=workspace_id, minimum=Role.ADMIN)
    errors = {}
    for name, value in thresholds.items():
        t = THRESHOLDS.get(name)
        if t is None:
            errors[name] = [_("There is no such threshold.")]
        elif isinstance(value, bool) or not isinstance(value, int) or not t.low <= value <= t.high:
            bounds = {"low": t.low, "high": t.high}
            errors[name] = [_("Give a whole number from %(low)s to %(high)s.") % bounds]
    if errors:
        raise Invalid(next(iter(errors.values()))[0], fields=errors)
    workspace.alert_thresholds = {**thresholds_of(workspace), **thresholds}
    workspace.save(update_fields=["alert_thresholds"])
    audit_record(
        actor=actor,
        action="workspace.alert_thresholds",
        workspace_id=workspace.id,
        target=workspace.id,
        **thresholds,
    )
    return workspace


# Evaluation


@dataclass(frozen=True)
class Finding:
    kind: str
    # What makes this occurrence: the same cause never raises two alerts.
    cause: str
    detail: dict


def alerts_evaluate(*, now: datetime | None = None) -> dict[str, int]:
    """Run every rule over every live desktop, as of `now`; how many alerts each rule raised."""
    now = now or timezone.now()
    raised: dict[str, int] = {}
    with _alone() as alone:
        if not alone:
            return raised  # another evaluation is under way; its readings would be taken twice
        # Whichever way a desktop went (its destroy step, reconcile), its alerts do not outlive it.
        alerts_resolve_destroyed()
        live = Desktop.objects.exclude(state=DesktopState.DESTROYED)
        for desktop in live.select_related("plan", "workspace"):
            limits = thresholds_of(desktop.workspace)
            for finding in _findings(desktop, limits, now):
                if _raise(desktop, finding):
                    raised[finding.kind] = raised.get(finding.kind, 0) + 1
    return raised


# The PostgreSQL advisory lock one evaluation holds while it runs.
EVALUATION_LOCK = 0x4C42_414C


@contextmanager
def _alone():
    """Whether this evaluation is the only one under way (two workers may take the beat's task)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [EVALUATION_LOCK])
        alone = cursor.fetchone()[0]
    try:
        yield alone
    finally:
        if alone:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_unlock(%s)", [EVALUATION_LOCK])


def _findings(desktop: Desktop, limits: dict[str, int], now: datetime) -> list[Finding]:
    found = [_in_error(desktop), _stuck(desktop, now), _agent(desktop, now), _long_turn(desktop, limits, now)]
    running, plan = desktop.state == DesktopState.RUNNING, desktop.plan
    usage = desktop_resource_usage(desktop)  # None unless running
    disk = desktop_disk_usage(desktop) if running else None
    cpu = _rate(desktop, Kind.CPU, usage and usage.cpu_seconds, now)
    new_blocked = blocked_attempts_record(desktop) if running else None
    blocked = _rate(desktop, Kind.EGRESS, new_blocked, now, counter=False)
    commands = _rate(desktop, Kind.COMMANDS, desktop.agent_commands if running else None, now)
    memory = _share(usage and usage.memory_bytes, plan.memory_mib * MIB)
    disk, cpu = _share(disk, plan.disk_gib * GIB), _share(cpu, plan.vcpus)
    sustained = limits["sustained_seconds"]
    # A burst is one evaluation's rate above the limit: it holds for no while before it is raised.
    for kind, value, limit, seconds in (
        (Kind.MEMORY, memory, limits["memory_percent"], sustained),
        (Kind.CPU, cpu, limits["cpu_percent"], sustained),
        (Kind.DISK, disk, limits["disk_percent"], sustained),
        (Kind.EGRESS, _per_minute(blocked), limits["blocked_per_minute"], 0),
        (Kind.COMMANDS, _per_minute(commands), limits["commands_per_minute"], 0),
    ):
        since = _spell(desktop, kind, value is not None and value >= limit, now)
        if since and since <= now - timedelta(seconds=seconds):
            found.append(Finding(kind, f"since:{since.isoformat()}", {"value": round(value), "limit": limit}))
    return [f for f in found if f]


def _share(used: float | None, cap: float) -> float | None:
    return None if used is None else 100 * used / cap


def _per_minute(per_second: float | None) -> float | None:
    return None if per_second is None else per_second * 60


def agent_commands_record(*, desktop: Desktop, commands: int) -> None:
    """The desktop's agent runtime ran this many more commands (reported from inside the desktop)."""
    Desktop.objects.filter(id=desktop.id).update(agent_commands=F("agent_commands") + commands)


def alerts_resolve_destroyed(*, desktop_id: str | None = None) -> int:
    """Resolve the open alerts of destroyed desktops (of this one only, if named); how many.

    Nobody can see to them any more: left open, they would count in the navigation forever.
    """
    found = Alert.objects.filter(status=Status.OPEN, desktop__state=DesktopState.DESTROYED)
    if desktop_id:
        found = found.filter(desktop_id=desktop_id)
    resolved = 0
    for alert in found.select_related("desktop", "acknowledged_by"):
        with transaction.atomic():
            # Conditional: an acknowledgement, or another resolution, at the same moment wins.
            if not Alert.objects.filter(id=alert.id, status=Status.OPEN).update(
                status=Status.RESOLVED,
                resolution=Alert.Resolution.DESKTOP_DESTROYED,
                resolved_at=timezone.now(),
            ):
                continue
            alert.refresh_from_db()
            audit_record(
                actor=SYSTEM,
                action="alert.resolved",
                workspace_id=alert.workspace_id,
                target=alert.desktop_id,
                alert=alert.id,
                resolution=alert.resolution,
            )
            _publish(alert)
            resolved += 1
    return resolved


def _in_error(desktop: Desktop) -> Finding | None:
    if desktop.state != DesktopState.ERROR:
        return None
    cause = f"error:{desktop.state_changed_at.isoformat()}"
    return Finding(Kind.ERROR, cause, {"reason": desktop.last_error[:1000]})


def _stuck(desktop: Desktop, now: datetime) -> Finding | None:
    if not step_waiting_since(desktop, now, settings.LIFECYCLE_REQUEUE_AFTER):
        return None
    changed = desktop.state_changed_at
    return Finding(
        Kind.STUCK,
        f"{desktop.state}:{changed.isoformat()}",
        {"step": STEPS_BY_VIA[desktop.state], "since": changed.isoformat()},
    )


def _agent(desktop: Desktop, now: datetime) -> Finding | None:
    """The last turn failed, or nobody has followed a running turn for long: the runtime is down."""
    replies = desktop.messages.filter(author=ChatMessage.Author.AGENT)
    silent = replies.filter(
        status=ChatMessage.Status.RUNNING,
        heartbeat_at__lt=now - timedelta(seconds=SILENT_AFTER * settings.CHAT_STALE_AFTER),
    ).first()
    if silent is not None:
        return Finding(Kind.AGENT, f"silent:{silent.id}", {"turn": silent.id, "silent": True})
    last = (
        replies.filter(
            status__in=(ChatMessage.Status.DONE, ChatMessage.Status.ERROR), completed_at__gte=now - RECENT
        )
        .order_by("-completed_at")
        .first()
    )
    if last is None or last.status != ChatMessage.Status.ERROR:
        return None
    return Finding(Kind.AGENT, f"failed:{last.id}", {"turn": last.id, "error": last.content[-2000:]})


def _long_turn(desktop: Desktop, limits: dict[str, int], now: datetime) -> Finding | None:
    # Timed from when a worker started each turn, not from when its message came: time spent queued
    # behind other turns is not the agent's. (Turns from before that was kept count from their message.)
    turns = ChatMessage.objects.filter(author=ChatMessage.Author.AGENT).annotate(
        began=Coalesce("started_at", "created_at")
    )
    running = turns.filter(desktop=desktop, status=ChatMessage.Status.RUNNING).first()
    if running is None:
        return None
    took = (
        turns.filter(
            desktop__workspace_id=desktop.workspace_id,
            status=ChatMessage.Status.DONE,
            completed_at__isnull=False,
        )
        .order_by("-completed_at")
        .values_list("began", "completed_at")[:USUAL_TURNS]
    )
    usual = statistics.median([(end - start).total_seconds() for start, end in took]) if took else 0
    limit = max(limits["long_turn_minimum"], limits["long_turn_factor"] * usual)
    elapsed = (now - running.began).total_seconds()
    if elapsed < limit:
        return None
    return Finding(
        Kind.LONG_TURN,
        f"turn:{running.id}",
        {"turn": running.id, "minutes": round(elapsed / 60), "usual_minutes": round(usual / 60)},
    )


def _rate(desktop: Desktop, kind: str, value: float | None, now: datetime, counter=True) -> float | None:
    """Per second since the last reading: of a counter's growth (`value`, cumulative), or of `value`
    itself (what was new since then). None with no value, or no earlier reading."""
    watch, _created = AlertWatch.objects.get_or_create(desktop=desktop, kind=kind)
    before = watch.reading
    watch.reading = {} if value is None else {"value": value, "at": now.isoformat()}
    if watch.reading != before:  # a stopped desktop's evaluations write nothing
        watch.save(update_fields=["reading"])
    if value is None or not before:
        return None
    seconds = (now - datetime.fromisoformat(before["at"])).total_seconds()
    if seconds <= 0:
        return None
    grown = value - before["value"] if counter else value
    return max(grown, 0) / seconds


def _spell(desktop: Desktop, kind: str, holding: bool, now: datetime) -> datetime | None:
    """Since when the rule's condition has held without a break; None when it does not hold now."""
    if not holding:
        AlertWatch.objects.filter(desktop=desktop, kind=kind, since__isnull=False).update(since=None)
        return None
    watch, _created = AlertWatch.objects.get_or_create(desktop=desktop, kind=kind)
    if watch.since is None:
        # Conditional: of two evaluations at once, both keep the first one's start.
        AlertWatch.objects.filter(id=watch.id, since=None).update(since=now)
        watch.refresh_from_db(fields=["since"])
    return watch.since


def _raise(desktop: Desktop, finding: Finding) -> Alert | None:
    """The alert, unless one is open for the rule on this desktop or its cause was raised already."""
    same = Alert.objects.filter(desktop=desktop, kind=finding.kind)
    if same.filter(Q(status=Status.OPEN) | Q(cause=finding.cause)).exists():
        return None
    try:
        with transaction.atomic():
            alert = Alert.objects.create(
                workspace_id=desktop.workspace_id,
                desktop=desktop,
                kind=finding.kind,
                cause=finding.cause[:200],
                detail=finding.detail,
            )
            audit_record(
                actor=SYSTEM,
                action="alert.raised",
                workspace_id=desktop.workspace_id,
                target=desktop.id,
                alert=alert.id,
                kind=alert.kind,
            )
            _publish(alert)
            enqueue(ALERT_EMAIL, alert_id=alert.id, workspace_id=desktop.workspace_id)
    except IntegrityError:  # another evaluation raised it meanwhile
        return None
    return alert


# People


def alert_acknowledge(*, actor: Actor, alert_id: str) -> Alert:
    """Someone who may take control of the desktop has seen the alert; the first to say so is recorded."""
    alert = alert_get(actor=actor, alert_id=alert_id)
    workspace_for_control(actor=actor, workspace_id=alert.workspace_id)
    now = timezone.now()
    with transaction.atomic():
        if not Alert.objects.filter(id=alert.id, status=Status.OPEN).update(
            status=Status.ACKNOWLEDGED, acknowledged_by=actor.user, acknowledged_at=now
        ):
            raise Conflict(_("This alert is not open any more: it was acknowledged or resolved."))
        alert.refresh_from_db()
        audit_record(
            actor=actor,
            action="alert.acknowledged",
            workspace_id=alert.workspace_id,
            target=alert.desktop_id,
            alert=alert.id,
        )
        _publish(alert)
    return alert


def alert_list(
    *,
    actor: Actor,
    workspace_id: str | None = None,
    desktop_id: str | None = None,
    status: str | None = None,
    kind: str | None = None,
) -> QuerySet[Alert]:
    """The alerts of the workspaces the actor belongs to, newest first."""
    if workspace_id:
        workspace_get(actor=actor, workspace_id=workspace_id)
    alerts = Alert.objects.filter(workspace__in=workspaces_visible(actor=actor))
    filters = {"workspace_id": workspace_id, "desktop_id": desktop_id, "status": status, "kind": kind}
    alerts = alerts.filter(**{name: value for name, value in filters.items() if value})
    return alerts.select_related("desktop", "acknowledged_by")


def alert_get(*, actor: Actor, alert_id: str) -> Alert:
    alert = alert_list(actor=actor).filter(id=alert_id).first()
    if alert is None:
        raise NotFound(_("Alert %(id)s not found.") % {"id": alert_id})
    return alert


def alerts_open_count(*, workspace_id: str) -> int:
    return Alert.objects.filter(workspace_id=workspace_id, status=Status.OPEN).count()


def alerts_open_by_desktop(*, desktop_ids: list[str]) -> dict[str, int]:
    found = Alert.objects.filter(desktop_id__in=desktop_ids, status=Status.OPEN)
    return dict(found.values("desktop_id").annotate(n=Count("id")).values_list("desktop_id", "n"))


def alert_message(alert: Alert) -> str:
    """What happened, in the reader's language."""
    d = {**alert.detail, "desktop": alert.desktop.name}
    if alert.kind == Kind.ERROR:
        return _("%(desktop)s is in error: %(reason)s") % d
    if alert.kind == Kind.STUCK:
        return _("The %(step)s step of %(desktop)s has not moved on for too long, with no worker on it.") % d
    if alert.kind == Kind.MEMORY:
        return _("%(desktop)s uses %(value)s%% of its plan's memory (alert from %(limit)s%%).") % d
    if alert.kind == Kind.CPU:
        return _("%(desktop)s uses %(value)s%% of its plan's CPU (alert from %(limit)s%%).") % d
    if alert.kind == Kind.DISK:
        return _("%(desktop)s fills %(value)s%% of its plan's disk (alert from %(limit)s%%).") % d
    if alert.kind == Kind.AGENT and d.get("silent"):
        return _("The agent of %(desktop)s stopped answering: nobody follows its turn any more.") % d
    if alert.kind == Kind.AGENT:
        return _("The agent of %(desktop)s failed: %(failure)s") % {
            **d,
            "failure": failure_of(d.get("error", "")).message,
        }
    if alert.kind == Kind.LONG_TURN:
        return (
            _("A turn of %(desktop)s has run for %(minutes)s minutes; turns usually take %(usual_minutes)s.")
            % d
        )
    if alert.kind == Kind.COMMANDS:
        return _("The agent of %(desktop)s ran %(value)s commands a minute (alert from %(limit)s).") % d
    return _("%(desktop)s made %(value)s blocked connection attempts a minute (alert from %(limit)s).") % d


def alert_email(*, alert_id: str) -> int:
    """Tell the people who may take control of the desktop, by e-mail; how many were told."""
    alert = Alert.objects.select_related("desktop", "workspace").filter(id=alert_id).first()
    if alert is None or alert.status != Status.OPEN:
        return 0
    emails = member_emails(workspace=alert.workspace, minimum=Role(alert.workspace.control_role))
    subject = _("[Le Bureau] Alert on %(desktop)s: %(kind)s") % {
        "desktop": alert.desktop.name,
        "kind": alert.get_kind_display(),
    }
    body = _("%(message)s\n\nSee and acknowledge it: %(link)s\n") % {
        "message": alert_message(alert),
        "link": _described(alert)["seeAt"],
    }
    return send_mass_mail([(subject, body, None, [email]) for email in emails])


# The workspace's webhook event for an alert in each status.
WEBHOOK_EVENTS = {
    Status.OPEN: "alert.raised",
    Status.ACKNOWLEDGED: "alert.acknowledged",
    Status.RESOLVED: "alert.resolved",
}


def _publish(alert: Alert) -> None:
    webhook_notify(
        workspace_id=alert.workspace_id,
        event=WEBHOOK_EVENTS[alert.status],
        payload={"alert": _described(alert)},
    )
    publish_alert_change(
        AlertChanged(
            alert_id=alert.id,
            desktop_id=alert.desktop_id,
            workspace_id=alert.workspace_id,
            status=alert.status,
        )
    )


def _described(alert: Alert) -> dict:
    acknowledged_by = alert.acknowledged_by.email if alert.acknowledged_by else ""
    return {
        "id": alert.id,
        "workspaceId": alert.workspace_id,
        "desktopId": alert.desktop_id,
        "desktopName": alert.desktop.name,
        "kind": alert.kind,
        "message": alert_message(alert),
        "detail": alert.detail,
        "status": alert.status,
        "raisedAt": alert.raised_at.isoformat(),
        "acknowledgedBy": acknowledged_by,
        "resolution": alert.resolution,
        "resolvedAt": alert.resolved_at.isoformat() if alert.resolved_at else None,
        "seeAt": settings.SITE_URL
        + reverse("alerts", args=[alert.workspace_id], urlconf=settings.ROOT_URLCONF),
    }
