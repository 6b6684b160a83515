"""Scheduled messages: a cron expression and a message for a desktop's agent, sent on time as the person
who made the schedule; the desktop is started first if it is not running, and stopped after the answer
if the schedule says so.

Beat claims due schedules every minute by moving each one's next run, with a conditional UPDATE, to the
first time after now: a control plane that was down for hours runs each missed schedule once, not once
per missed time, and two beats never both claim one run.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext as _

from desktops.audit import Actor, audit_record
from desktops.errors import DomainError, Invalid
from desktops.models import ChatMessage, Desktop, Schedule, ScheduleRun
from desktops.models import DesktopState as S
from desktops.queue import SCHEDULE_FIRE, enqueue
from desktops.selectors import workspace_for_control
from desktops.services import chat_message_checked, chat_send, desktop_act

Run = ScheduleRun.Status
# Closer runs than this would make an agent's queue grow faster than it answers.
MIN_INTERVAL = timedelta(minutes=5)
MAX_PER_DESKTOP = 20
# How long a run waits for its desktop to come up before it fails.
START_WAIT = timedelta(minutes=15)
WAITING, FINISHED = "waiting", "finished"


def next_run(cron: str, tz: str, after: datetime) -> datetime:
    return croniter(cron, after.astimezone(ZoneInfo(tz))).get_next(datetime)


def _checked(cron: str, tz: str, message: str) -> tuple[str, str, str]:
    cron, message = " ".join(cron.split()), message.strip()
    try:
        ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise Invalid(
            _("Unknown time zone %(tz)r: use a name such as Europe/Paris or UTC.") % {"tz": tz},
            fields={"timezone": [_("Unknown.")]},
        ) from exc
    if len(cron.split()) != 5 or not croniter.is_valid(cron):
        raise Invalid(
            _("%(cron)r is not a cron expression of five fields (minute hour day month weekday).")
            % {"cron": cron},
            fields={"cron": [_("Not a cron expression.")]},
        )
    times = croniter(cron, timezone.now().astimezone(ZoneInfo(tz)))
    try:
        upcoming = [times.get_next(datetime) for _i in range(12)]
    except CroniterBadDateError as exc:  # valid fields, no date: 30 February
        raise Invalid(
            _("%(cron)r never comes: no date matches it.") % {"cron": cron},
            fields={"cron": [_("Never comes.")]},
        ) from exc
    if min(b - a for a, b in pairwise(upcoming)) < MIN_INTERVAL:
        raise Invalid(
            _("A schedule runs at most every %(minutes)d minutes.") % {"minutes": MIN_INTERVAL.seconds // 60},
            fields={"cron": [_("Too often.")]},
        )
    return cron, tz, chat_message_checked(message)


def schedule_create(
    *,
    actor: Actor,
    desktop: Desktop,
    cron: str,
    message: str,
    tz: str = "UTC",
    stop_after: bool = False,
    enabled: bool = True,
) -> Schedule:
    """A schedule for the desktop; it sends messages as its author, so it needs the control role."""
    workspace_for_control(actor=actor, workspace_id=desktop.workspace_id)
    cron, tz, message = _checked(cron, tz, message)
    if desktop.schedules.count() >= MAX_PER_DESKTOP:
        raise Invalid(_("A desktop has at most %(max)d schedules.") % {"max": MAX_PER_DESKTOP})
    with transaction.atomic():
        schedule = Schedule.objects.create(
            desktop=desktop,
            cron=cron,
            timezone=tz,
            message=message,
            stop_after=stop_after,
            enabled=enabled,
            next_run_at=next_run(cron, tz, timezone.now()) if enabled else None,
            created_by=actor.user,
            created_with_key=actor.api_key,
            made_with_key=actor.api_key is not None,
        )
        audit_record(
            actor=actor,
            action="schedule.create",
            workspace_id=desktop.workspace_id,
            target=schedule.id,
            desktop=desktop.id,
            cron=cron,
        )
    return schedule


def schedule_update(*, actor: Actor, schedule: Schedule, **changes) -> Schedule:
    """Change a schedule (cron, timezone, message, stop_after, enabled); it then runs as the one who changed
    it, who needs the control role."""
    workspace_for_control(actor=actor, workspace_id=schedule.desktop.workspace_id)
    for name, value in changes.items():
        setattr(schedule, name, value)
    schedule.cron, schedule.timezone, schedule.message = _checked(
        schedule.cron, schedule.timezone, schedule.message
    )
    schedule.next_run_at = (
        next_run(schedule.cron, schedule.timezone, timezone.now()) if schedule.enabled else None
    )
    schedule.created_by, schedule.created_with_key = actor.user, actor.api_key
    schedule.made_with_key = actor.api_key is not None
    with transaction.atomic():
        schedule.save()
        audit_record(
            actor=actor,
            action="schedule.update",
            workspace_id=schedule.desktop.workspace_id,
            target=schedule.id,
            changed=sorted(changes),
        )
    return schedule


def schedule_delete(*, actor: Actor, schedule: Schedule) -> None:
    workspace_for_control(actor=actor, workspace_id=schedule.desktop.workspace_id)
    with transaction.atomic():
        audit_record(
            actor=actor,
            action="schedule.delete",
            workspace_id=schedule.desktop.workspace_id,
            target=schedule.id,
        )
        schedule.delete()


# Beat and the workers


def schedules_claim(*, now: datetime | None = None) -> list[str]:
    """Claim every due schedule once (its next run moves past now) and hand each run to a worker."""
    now = now or timezone.now()
    claimed = []
    for schedule in Schedule.objects.filter(enabled=True, next_run_at__lte=now):
        following = next_run(schedule.cron, schedule.timezone, now)
        with transaction.atomic():
            due = Schedule.objects.filter(id=schedule.id, enabled=True, next_run_at=schedule.next_run_at)
            if not due.update(next_run_at=following):
                continue  # claimed by another beat, or changed meanwhile
            run = ScheduleRun.objects.create(schedule=schedule, due_at=schedule.next_run_at)
            enqueue(SCHEDULE_FIRE, run_id=run.id)
        claimed.append(run.id)
    return claimed


def schedule_fire(*, run_id: str) -> str:
    """Take one run a step further: start the desktop, or send the message once it runs. WAITING while
    the desktop is on its way up (ask again later), FINISHED otherwise."""
    run = (
        ScheduleRun.objects.select_related(
            "schedule__desktop", "schedule__created_by", "schedule__created_with_key"
        )
        .filter(id=run_id)
        .first()
    )
    if run is None or run.status not in (Run.PENDING, Run.STARTING):
        return FINISHED  # done already: a task delivered twice
    schedule, desktop = run.schedule, Desktop.objects.get(id=run.schedule.desktop_id)
    author = schedule.created_by
    if author is None or not author.is_active:
        return _fail(run, _("The schedule's author has left: edit the schedule to run it as yourself."))
    if not _key_usable(schedule):
        return _fail(
            run, _("The API key that made the schedule is revoked: edit the schedule to run it as yourself.")
        )
    actor = schedule_actor(schedule)
    try:
        workspace_for_control(actor=actor, workspace_id=desktop.workspace_id)
        if desktop.state == S.RUNNING:
            return _send(run, actor, desktop)
        if timezone.now() - run.created_at > START_WAIT:
            return _fail(
                run,
                _("The desktop did not come up in time (it is %(state)s).")
                % {"state": desktop.get_state_display()},
            )
        step = {S.STOPPED: "start", S.ERROR: "start", S.SUSPENDED: "resume"}.get(desktop.state)
        if step and run.status == Run.STARTING:
            why = desktop.last_error or desktop.state
            return _fail(run, _("The desktop did not start: %(why)s") % {"why": why})
        if step:
            with transaction.atomic():
                if ScheduleRun.objects.filter(id=run.id, status=Run.PENDING).update(status=Run.STARTING):
                    desktop_act(actor=actor, desktop=desktop, action=step)
            return WAITING
        if desktop.state in (S.DESTROYING, S.DESTROYED):
            return _fail(run, _("The desktop is %(state)s.") % {"state": desktop.get_state_display()})
        return WAITING  # provisioning, starting, resuming, stopping, suspending: it settles first
    except DomainError as exc:
        return _fail(run, exc.message)


def _key_usable(schedule: Schedule) -> bool:
    """A schedule made with an API key runs only while the key would still be let in."""
    if not schedule.made_with_key:
        return True
    key = schedule.created_with_key  # None once the key is deleted
    return key is not None and key.usable()


def schedule_actor(schedule: Schedule) -> Actor:
    """Who a schedule acts as: its author, through the schedule (so the audit trail tells them apart)."""
    return Actor(user=schedule.created_by, system=f"schedule:{schedule.id}")


def _send(run: ScheduleRun, actor: Actor, desktop: Desktop) -> str:
    with transaction.atomic():
        # Sent once, whichever copy of the task gets here first.
        if ScheduleRun.objects.filter(id=run.id, status__in=(Run.PENDING, Run.STARTING)).update(
            status=Run.SENT
        ):
            reply = chat_send(actor=actor, desktop=desktop, message=run.schedule.message)
            ScheduleRun.objects.filter(id=run.id).update(reply=reply)
    return FINISHED


def _fail(run: ScheduleRun, why: str) -> str:
    ScheduleRun.objects.filter(id=run.id, status__in=(Run.PENDING, Run.STARTING)).update(
        status=Run.FAILED, error=why
    )
    return FINISHED


def schedule_turn_ended(*, message_id: str) -> None:
    """An agent's answer is over: the run that sent it is done, and its desktop stops if the schedule
    says so and nothing else waits for the agent."""
    run = ScheduleRun.objects.select_related("schedule__created_by").filter(reply_id=message_id).first()
    if run is None or not ScheduleRun.objects.filter(id=run.id, status=Run.SENT).update(status=Run.DONE):
        return
    if not run.schedule.stop_after:
        return
    desktop = Desktop.objects.get(id=run.schedule.desktop_id)
    busy = ChatMessage.objects.filter(
        desktop=desktop, status__in=(ChatMessage.Status.QUEUED, ChatMessage.Status.RUNNING)
    ).exclude(id=message_id)
    if busy.exists():
        ScheduleRun.objects.filter(id=run.id).update(
            error=_("Left running: more messages wait for the agent.")
        )
        return
    try:
        desktop_act(actor=schedule_actor(run.schedule), desktop=desktop, action="stop")
    except DomainError as exc:
        ScheduleRun.objects.filter(id=run.id).update(error=exc.message)
