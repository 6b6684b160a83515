"""How the domain hands work to the workers: by task name, sent once the transaction commits.

The domain never imports the queue's entry points (``workers.tasks``, a face like the views); the
names below are the contract between the two, and also what may sit in a broker during an upgrade,
so they never change. Which queue each goes to is routing (``CELERY_TASK_ROUTES``), not code here.
"""

from __future__ import annotations

from celery import current_app
from django.db import transaction

DESKTOP_STEP = "workers.tasks.desktop_{action}"
CHAT_DELIVER = "workers.tasks.chat_deliver"
CHAT_STOP = "workers.tasks.chat_stop"
WORKSPACE_AGENT_CONFIGURE = "workers.tasks.workspace_agent_configure"
LLM_KEY_CHECK = "workers.tasks.llm_key_check"
SCHEDULE_FIRE = "workers.tasks.schedule_fire"
DESKTOP_EGRESS_APPLY = "workers.tasks.desktop_egress_apply"
WEBHOOK_DELIVER = "workers.tasks.webhook_deliver"
APPROVAL_EMAIL = "workers.tasks.approval_email"
APPROVAL_SCREENSHOT = "workers.tasks.approval_screenshot"
ALERT_EMAIL = "workers.tasks.alert_email"


def enqueue(task: str, **kwargs) -> None:
    """Send ``task`` with these keyword arguments when the current transaction commits (now if none)."""
    transaction.on_commit(lambda: current_app.send_task(task, kwargs=kwargs))


def enqueue_step(*, desktop_id: str, action: str) -> None:
    enqueue(DESKTOP_STEP.format(action=action), desktop_id=desktop_id)
