"""Celery tasks: thin, take ids, re-fetch, call the lifecycle, and exit quietly if the row is gone."""

from celery import Task
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings

from desktops import chat, lifecycle
from lebureau.celery import app
from workers.drivers import get_driver
from workers.drivers.base import TransientDriverError

# Seconds a step may take before it is failed; provisioning includes the first boot.
TIME_LIMITS = {"provision": 900, "start": 300, "stop": 300, "suspend": 120, "resume": 120, "destroy": 300}


class DesktopStepTask(Task):
    """Puts the desktop in `error` once a step has failed for good (retries spent, timeout, bug)."""

    action = ""

    def on_failure(self, exc, task_id, args, kwargs, einfo):
        if isinstance(exc, SoftTimeLimitExceeded):
            message = f"The {self.action} step took longer than {TIME_LIMITS[self.action]} s."
        elif isinstance(exc, TransientDriverError):
            message = f"{exc.message} (gave up after {self.max_retries} retries)"
        else:
            message = f"The {self.action} step failed unexpectedly ({type(exc).__name__})."
        lifecycle.desktop_step_failed(desktop_id=kwargs["desktop_id"], action=self.action, message=message)


def _step_task(action: str):
    def run(self, *, desktop_id: str) -> None:
        lifecycle.desktop_run_step(desktop_id=desktop_id, action=action)

    return app.task(
        run,
        name=f"workers.tasks.desktop_{action}",
        base=DesktopStepTask,
        bind=True,
        action=action,
        acks_late=True,
        autoretry_for=(TransientDriverError,),
        retry_backoff=2,
        retry_backoff_max=settings.DRIVER_RETRY_BACKOFF_MAX,
        retry_jitter=True,
        max_retries=settings.DRIVER_RETRY_MAX,
        soft_time_limit=TIME_LIMITS[action],
        time_limit=TIME_LIMITS[action] + 30,
    )


STEP_TASKS = {action: _step_task(action) for action in lifecycle.TRANSITIONS}


@app.task(name="workers.tasks.reconcile", acks_late=True, soft_time_limit=120)
def reconcile() -> dict[str, list[str]]:
    return lifecycle.reconcile()


@app.task(name="workers.tasks.chat_deliver", acks_late=True, soft_time_limit=chat.TURN_TIMEOUT + 60)
def chat_deliver(*, message_id: str) -> None:
    chat.chat_deliver(message_id=message_id)


@app.task(name="workers.tasks.refill_warm_pool", acks_late=True, soft_time_limit=1800, time_limit=1830)
def refill_warm_pool() -> dict[str, int]:
    """Keep the Proxmox warm pool at its size; nothing to do for other engines or a zero-sized pool."""
    if settings.COMPUTE_DRIVER != "proxmox" or not settings.PROXMOX_WARM_POOL:
        return {}
    return get_driver("proxmox").refill_pool()


@app.task(name="workers.tasks.refresh_allowed_domains", acks_late=True, soft_time_limit=600, time_limit=630)
def refresh_allowed_domains() -> dict[str, tuple[str, ...]]:
    """Keep the Proxmox desktops' allowed-domain IP sets on the domains' current addresses."""
    if settings.COMPUTE_DRIVER != "proxmox":
        return {}
    return get_driver("proxmox").refresh_allowed_domains()
