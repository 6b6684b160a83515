"""Celery tasks, the queue's face: thin, take ids, re-fetch, call the domain, exit quietly if the row is gone.

Names are stable (a broker may hold messages across an upgrade); those the domain sends by name come
from ``desktops.queue``.
"""

import paramiko
from celery import Task, shared_task
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import worker_init
from django.conf import settings
from django.db import OperationalError
from django.utils.translation import gettext as _

from billing import services as billing
from desktops import (
    agent_config,
    alerts,
    approvals,
    audit,
    chat,
    egress,
    engines,
    lifecycle,
    schedules,
    selectors,
    webhooks,
)
from desktops.engines import TransientDriverError
from desktops.queue import (
    ALERT_EMAIL,
    APPROVAL_EMAIL,
    APPROVAL_SCREENSHOT,
    CHAT_DELIVER,
    CHAT_STOP,
    DESKTOP_EGRESS_APPLY,
    DESKTOP_STEP,
    LLM_KEY_CHECK,
    SCHEDULE_FIRE,
    WEBHOOK_DELIVER,
    WORKSPACE_AGENT_CONFIGURE,
)
from desktops.slots import slot_free, slot_take


@worker_init.connect
def _preload(**_kwargs):
    # In the worker's main process, so that its forked processes start with it.
    engines.engines_preload()


# Seconds a step may take before it is failed; provisioning includes the first boot.
TIME_LIMITS = {"provision": 900, "start": 300, "stop": 300, "suspend": 120, "resume": 120, "destroy": 300}


class DesktopStepTask(Task):
    """Puts the desktop in `error` once a step has failed for good (retries spent, timeout, bug)."""

    action = ""

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        detail = ""
        if isinstance(exc, SoftTimeLimitExceeded):
            message = _("The %(step)s step took longer than %(seconds)s s.") % {
                "step": self.action,
                "seconds": TIME_LIMITS[self.action],
            }
        elif isinstance(exc, TransientDriverError):
            message = _("%(failure)s (gave up after %(retries)s retries)") % {
                "failure": lifecycle.engine_failure(exc, self.action),
                "retries": self.max_retries,
            }
            detail = exc.message
        else:
            message = _("The %(step)s step failed unexpectedly.") % {"step": self.action}
            detail = f"{type(exc).__name__}: {exc}"
        lifecycle.desktop_step_failed(
            desktop_id=kwargs["desktop_id"], action=self.action, message=message, detail=detail
        )


# A desktop that has just come up gets the agent runtime's configuration (keys may have changed meanwhile).
CONFIGURE_AFTER = {"provision", "start", "resume"}
# Failures to reach a desktop over SSH that are worth another try.
SSH_TRANSIENT = (
    paramiko.SSHException,
    paramiko.ssh_exception.NoValidConnectionsError,
    ConnectionError,
    TimeoutError,
)


# How long a step whose workspace has all its slots busy waits before it asks again.
SLOT_WAIT = 2


def _step_task(action: str):
    def run(self, *, desktop_id: str) -> None:
        holder = self.request.id
        if not lifecycle.desktop_step_slot(
            desktop_id=desktop_id, seconds=TIME_LIMITS[action] + 30, holder=holder
        ):
            # A fresh copy, later; this worker slot goes to another step meanwhile.
            self.apply_async(kwargs={"desktop_id": desktop_id}, countdown=SLOT_WAIT)
            return
        try:
            up = lifecycle.desktop_run_step(desktop_id=desktop_id, action=action)
        finally:
            lifecycle.desktop_step_slot_free(desktop_id=desktop_id, holder=holder)
        if up and action in CONFIGURE_AFTER:
            agent_configure.delay(desktop_id=desktop_id)
        if up and action == "provision":
            # The policy may have changed while the desktop was being made with the one it had then.
            desktop_egress_apply.delay(desktop_id=desktop_id)
        if up and action == "destroy":
            # At once, rather than at the next evaluation: the navigation's count drops with the desktop.
            alerts.alerts_resolve_destroyed(desktop_id=desktop_id)

    return shared_task(
        run,
        name=DESKTOP_STEP.format(action=action),
        base=DesktopStepTask,
        bind=True,
        action=action,
        acks_late=True,
        # OperationalError: the database cut off for a moment (PostgreSQL restarted): the step is
        # carried out again on a new connection, harmlessly as a redelivered one (`desktop_run_step`).
        autoretry_for=(TransientDriverError, OperationalError),
        retry_backoff=2,
        retry_backoff_max=settings.DRIVER_RETRY_BACKOFF_MAX,
        retry_jitter=True,
        max_retries=settings.DRIVER_RETRY_MAX,
        soft_time_limit=TIME_LIMITS[action],
        time_limit=TIME_LIMITS[action] + 30,
    )


STEP_TASKS = {action: _step_task(action) for action in lifecycle.TRANSITIONS}


@shared_task(name="workers.tasks.reconcile", acks_late=True, soft_time_limit=120)
def reconcile() -> dict[str, list[str]]:
    return lifecycle.reconcile()


def _engine_maintenance() -> dict[str, dict]:
    return engines.engines_maintain()


# One generic beat task runs each engine's own periodic work (``ComputeDriver.maintenance``).
engine_maintenance = shared_task(
    _engine_maintenance,
    name="workers.tasks.engine_maintenance",
    acks_late=True,
    soft_time_limit=1800,
    time_limit=1830,
)
# Their names before engines owned their periodic work: a copy may still sit in a broker after an upgrade.
for _legacy in ("workers.tasks.refill_warm_pool", "workers.tasks.refresh_allowed_domains"):
    shared_task(_engine_maintenance, name=_legacy, acks_late=True, soft_time_limit=1800, time_limit=1830)


@shared_task(name="workers.tasks.billing_meter", acks_late=True, soft_time_limit=1800, time_limit=1830)
def billing_meter() -> dict:
    return billing.billing_meter()


@shared_task(
    name=DESKTOP_EGRESS_APPLY,
    acks_late=True,
    autoretry_for=(TransientDriverError,),
    retry_backoff=1,
    retry_backoff_max=settings.DRIVER_RETRY_BACKOFF_MAX,
    max_retries=settings.DRIVER_RETRY_MAX,
    soft_time_limit=60,
)
def desktop_egress_apply(*, desktop_id: str) -> bool:
    """Enforce the desktop's egress policy in its engine, running or not."""
    return egress.desktop_egress_apply(desktop_id=desktop_id)


@shared_task(
    name="workers.tasks.agent_configure",
    acks_late=True,
    autoretry_for=SSH_TRANSIENT,
    retry_backoff=2,
    max_retries=settings.DRIVER_RETRY_MAX,
    soft_time_limit=120,
)
def agent_configure(*, desktop_id: str) -> None:
    agent_config.desktop_agent_configure(desktop_id=desktop_id)


@shared_task(name=WORKSPACE_AGENT_CONFIGURE, acks_late=True)
def workspace_agent_configure(*, workspace_id: str) -> None:
    """A workspace's keys changed: rewrite the configuration of each of its running desktops."""
    for desktop_id in selectors.desktop_ids_running(workspace_id=workspace_id):
        agent_configure.delay(desktop_id=desktop_id)


@shared_task(name=LLM_KEY_CHECK, acks_late=True)
def llm_key_check(*, key_id: str) -> None:
    """A key was added or rotated: ask its provider whether it takes it, from one of the desktops."""
    agent_config.llm_key_check(key_id=key_id)


# Chat tasks are acknowledged on receipt (acks_late=False, overriding the global default): a turn may
# outlast the broker's visibility timeout, and a redelivered copy would follow the same turn twice. A
# worker that dies with one loses nothing: `chat_resume` finds the turn by its stale heartbeat, or the
# queue that stalled.
@shared_task(name=CHAT_DELIVER, acks_late=False)
def chat_deliver(*, desktop_id: str) -> None:
    """Start the desktop's next queued agent turn, if it is idle, and follow it."""
    reply = chat.chat_claim_next(desktop_id=desktop_id)
    if reply is not None:
        chat_follow.delay(message_id=reply.id, follower=str(reply.follower))


# A turn may run for hours; its worker keeps the task until the agent is done.
@shared_task(
    name="workers.tasks.chat_follow", acks_late=False, soft_time_limit=settings.CHAT_TURN_TIMEOUT + 60
)
def chat_follow(*, message_id: str, follower: str) -> None:
    workspace_id = chat.chat_follow(message_id=message_id, follower=follower)
    if workspace_id:
        schedules.schedule_turn_ended(message_id=message_id)
        # The turn's slot is free: the next message of its desktop, or of another in the workspace.
        for desktop_id in chat.chat_waiting(workspace_id=workspace_id):
            chat_deliver.delay(desktop_id=desktop_id)


@shared_task(
    name=CHAT_STOP,
    acks_late=True,
    autoretry_for=SSH_TRANSIENT,
    retry_backoff=2,
    max_retries=settings.DRIVER_RETRY_MAX,
    soft_time_limit=60,
)
def chat_stop(*, message_id: str, started: bool) -> None:
    """An operator cancelled a turn: end its processes in the desktop, then let the queue move on."""
    workspace_id = chat.chat_stop(message_id=message_id, started=started)
    if workspace_id:
        schedules.schedule_turn_ended(message_id=message_id)
        for desktop_id in chat.chat_waiting(workspace_id=workspace_id):
            chat_deliver.delay(desktop_id=desktop_id)


@shared_task(name="workers.tasks.chat_resume", acks_late=True, soft_time_limit=60)
def chat_resume() -> None:
    """Hand turns whose worker died to a live one, and restart stalled queues."""
    orphans, stalled = chat.chat_resume()
    for message_id, follower in orphans:
        chat_follow.delay(message_id=message_id, follower=follower)
    for desktop_id in stalled:
        chat_deliver.delay(desktop_id=desktop_id)


@shared_task(name="workers.tasks.approvals_expire", acks_late=True, soft_time_limit=60)
def approvals_expire() -> int:
    """Beat: refuse the requests for approval whose time is up."""
    return approvals.approvals_expire()


@shared_task(name="workers.tasks.audit_prune", acks_late=True, soft_time_limit=1800, time_limit=1830)
def audit_prune() -> int:
    """Beat, when AUDIT_RETENTION_DAYS is set: prune the audit trail behind a signed checkpoint."""
    return audit.audit_prune()


@shared_task(name="workers.tasks.audit_head_export", acks_late=True, soft_time_limit=60)
def audit_head_export() -> bool:
    """Beat, when AUDIT_HEAD_LOG is set: copy the audit chain's head outside the database."""
    return audit.audit_head_export()


# Notifications (e-mails, webhooks, an approval's screenshot) have a queue of their own, so that what a
# desktop or a tenant's receiver sets off never waits in front of anyone's lifecycle steps; and one
# workspace has at most NOTIFY_TASKS_PER_WORKSPACE of them under way at once, so that it cannot take
# that queue's workers either. A task over its workspace's share is sent again a little later, as a
# fresh copy that keeps its count of retries: no worker waits for the share.
NOTIFY_WAIT = 2


def notify_task(**options):
    def wrap(run):
        def shared(self, *, workspace_id: str = "", **ids):
            token = None
            if workspace_id:  # sent before workspaces had a share, during an upgrade: none
                token, _wait = slot_take(
                    key=f"notify:{workspace_id}",
                    limit=settings.NOTIFY_TASKS_PER_WORKSPACE,
                    seconds=options.get("soft_time_limit", 60) + 30,
                )
                if token is None:
                    self.apply_async(
                        kwargs={"workspace_id": workspace_id, **ids},
                        countdown=NOTIFY_WAIT,
                        retries=self.request.retries,
                    )
                    return None
            try:
                return run(self, **ids)
            finally:
                if token:
                    slot_free(key=f"notify:{workspace_id}", token=token)

        shared.__name__, shared.__doc__ = run.__name__, run.__doc__
        return shared_task(shared, bind=True, acks_late=True, **options)

    return wrap


# Telling people by e-mail: sent again while the mail server does not answer.
EMAIL_TASK = {"autoretry_for": (OSError,), "retry_backoff": 5, "max_retries": 5, "soft_time_limit": 60}


@notify_task(name=APPROVAL_SCREENSHOT, soft_time_limit=30)
def approval_screenshot(self, *, approval_id: str) -> bool:
    """Keep the asking desktop's screen with its request."""
    return approvals.approval_screenshot_take(approval_id=approval_id)


@notify_task(name=APPROVAL_EMAIL, **EMAIL_TASK)
def approval_email(self, *, approval_id: str) -> int:
    """Tell the people who may answer a request for approval that it waits."""
    return approvals.approval_email(approval_id=approval_id)


@shared_task(name="workers.tasks.alerts_evaluate", acks_late=True, soft_time_limit=120, time_limit=150)
def alerts_evaluate() -> dict[str, int]:
    """Beat: run the alert rules over every live desktop (and record their blocked egress attempts)."""
    return alerts.alerts_evaluate()


@notify_task(name=ALERT_EMAIL, **EMAIL_TASK)
def alert_email(self, *, alert_id: str) -> int:
    """Tell the people who may take control of a desktop of an alert raised on it."""
    return alerts.alert_email(alert_id=alert_id)


@notify_task(
    name=WEBHOOK_DELIVER,
    autoretry_for=(webhooks.DeliveryFailed,),
    retry_backoff=2,
    retry_backoff_max=600,
    retry_jitter=True,
    max_retries=settings.WEBHOOK_ATTEMPTS - 1,
    soft_time_limit=60,
)
def webhook_deliver(self, *, delivery_id: str) -> None:
    """Send one event to a workspace's webhook; a failed attempt is tried again later, with backoff."""
    webhooks.webhook_attempt(delivery_id=delivery_id, last=self.request.retries >= self.max_retries)


@shared_task(name="workers.tasks.schedules_run", acks_late=True, soft_time_limit=50)
def schedules_run() -> list[str]:
    """Beat, every minute: claim the schedules that are due and hand each run to a worker."""
    return schedules.schedules_claim()


# How long a scheduled run whose desktop is on its way up waits before it looks again.
SCHEDULE_WAIT = 5


@shared_task(name=SCHEDULE_FIRE, bind=True, acks_late=True, soft_time_limit=60)
def schedule_fire(self, *, run_id: str) -> None:
    if schedules.schedule_fire(run_id=run_id) == schedules.WAITING:
        # A fresh copy, later, rather than a worker slot held while the desktop boots.
        self.apply_async(kwargs={"run_id": run_id}, countdown=SCHEDULE_WAIT)
