"""The desktop state machine and the worker side of each lifecycle step.

Every transition is a conditional UPDATE on the current state, so two workers
(or a worker and an API call) can never both act on one desktop.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from django.utils.translation import gettext_lazy as _

from desktops.audit import SYSTEM, Actor, audit_record
from desktops.crypto import api_token_hash
from desktops.egress import egress_of_desktop
from desktops.engines import engine, engines_in_use
from desktops.events import DesktopStateChanged, publish_state_change
from desktops.guest import VNC_PASSWORD_FILE, control_plane_public_key, vnc_password_file
from desktops.models import AuditEvent, Desktop, DesktopEvent, Workspace
from desktops.models import DesktopState as S
from desktops.queue import enqueue_step
from workers.drivers.base import (
    IMAGE_MISSING,
    INVALID_SPEC,
    NO_CAPACITY,
    NOT_PROVISIONED,
    NOT_RESUMABLE,
    NOT_SUSPENDABLE,
    ComputeDriver,
    DriverError,
    InstanceSpec,
    InstanceState,
    InstanceStatus,
)

logger = logging.getLogger(__name__)

AGENT_TOKEN_PATH = "/etc/bureau/token"  # noqa: S105 (a path, not a secret)
GUEST_URL_PATH = "/etc/bureau/guest_url"


@dataclass(frozen=True)
class Transition:
    sources: frozenset[str]
    via: str
    target: str


TRANSITIONS: dict[str, Transition] = {
    "provision": Transition(frozenset(), S.PROVISIONING, S.RUNNING),
    "start": Transition(frozenset({S.STOPPED, S.ERROR}), S.STARTING, S.RUNNING),
    "stop": Transition(frozenset({S.RUNNING}), S.STOPPING, S.STOPPED),
    "suspend": Transition(frozenset({S.RUNNING}), S.SUSPENDING, S.SUSPENDED),
    "resume": Transition(frozenset({S.SUSPENDED}), S.RESUMING, S.RUNNING),
    "destroy": Transition(frozenset(S) - {S.DESTROYING, S.DESTROYED}, S.DESTROYING, S.DESTROYED),
}
# Which step a desktop in a transitional state is in.
STEPS_BY_VIA = {step.via: action for action, step in TRANSITIONS.items()}
# The desktop states a driver instance should be in; transitional states are not checked.
STEADY = {
    S.RUNNING: InstanceState.RUNNING,
    S.STOPPED: InstanceState.STOPPED,
    S.SUSPENDED: InstanceState.SUSPENDED,
}


def transition(
    *,
    desktop_id: str,
    sources: set[str] | frozenset[str],
    target: str,
    actor: Actor,
    reason: str = "",
    **fields,
) -> bool:
    """Move the desktop to `target` only if it is in one of `sources`; True if this call did it."""
    with transaction.atomic():
        # The row lock only makes `from_state` exact for the event; the UPDATE's condition decides.
        current = (
            Desktop.objects.select_for_update()
            .filter(id=desktop_id)
            .values_list("state", "workspace_id")
            .first()
        )
        if current is None:
            return False
        from_state, workspace_id = current
        changed = Desktop.objects.filter(id=desktop_id, state__in=sources).update(
            state=target, state_changed_at=timezone.now(), updated_at=timezone.now(), **fields
        )
        if changed != 1:
            return False
        DesktopEvent.objects.create(
            desktop_id=desktop_id, from_state=from_state, to_state=target, actor=actor.label, reason=reason
        )
        audit_record(
            actor=actor,
            action=f"desktop.{target}",
            workspace_id=workspace_id,
            target=desktop_id,
            reason=reason,
        )
        publish_state_change(DesktopStateChanged.of(Desktop.objects.get(id=desktop_id)))
    return True


def instance_spec(desktop: Desktop) -> tuple[InstanceSpec, str]:
    """What the engine needs to build the desktop, and the hash of the helper token put in it."""
    token = secrets.token_urlsafe(32)
    spec = InstanceSpec(
        key=desktop.id,
        hostname=desktop.name,
        vcpus=desktop.plan.vcpus,
        memory_mib=desktop.plan.memory_mib,
        disk_gib=desktop.plan.disk_gib,
        ssh_public_key=control_plane_public_key(),
        image_profile=desktop.image_profile,
        workspace=desktop.workspace_id,
        network_policy=egress_of_desktop(desktop=desktop).network_policy(),
        files={
            # The `bureau` helper's desktop-scoped credential for the control plane's guest endpoint.
            AGENT_TOKEN_PATH: token + "\n",
            # Where that credential is good: the guest endpoint, the only part of the control plane
            # a desktop can reach.
            GUEST_URL_PATH: settings.GUEST_URL + "\n",
            # The VNC server's passwords, which only the relays (deriving them) know besides it.
            VNC_PASSWORD_FILE: vnc_password_file(desktop.id),
        },
    )
    return spec, api_token_hash(token)


def desktop_step_slot(*, desktop_id: str, seconds: float, holder: str) -> bool:
    """Take one of the workspace's slots for a step on this desktop, for at most `seconds`.

    False while another task (`holder` names this one) carries out a step on the desktop, and when
    the workspace already has LIFECYCLE_STEPS_PER_WORKSPACE steps under way while another
    workspace's step waits: this step waits its turn without holding a worker, and the other goes
    first. With nobody else waiting the cap does not apply, so one tenant's burst uses every worker.
    """
    now = timezone.now()
    with transaction.atomic():
        desktop = Desktop.objects.select_for_update().filter(id=desktop_id).first()
        if desktop is None:
            return True  # nothing left to do: the step finds out and ends
        if desktop.step_until and desktop.step_until > now and desktop.step_holder != holder:
            return False
        # Slots in one workspace are taken in turn, on its row.
        Workspace.objects.select_for_update().filter(id=desktop.workspace_id).exists()
        busy = Desktop.objects.filter(workspace_id=desktop.workspace_id, step_until__gt=now).exclude(
            id=desktop_id
        )
        at_cap = busy.count() >= settings.LIFECYCLE_STEPS_PER_WORKSPACE
        if at_cap and _steps_waiting_elsewhere(desktop.workspace_id, now):
            return False
        Desktop.objects.filter(id=desktop_id).update(
            step_until=now + timedelta(seconds=seconds), step_holder=holder
        )
    return True


def _steps_waiting_elsewhere(workspace_id, now) -> bool:
    """Whether a desktop of another workspace is in a step that holds no slot yet (its task is queued)."""
    return (
        Desktop.objects.filter(state__in=list(STEPS_BY_VIA))
        .exclude(workspace_id=workspace_id)
        .exclude(step_until__gt=now)
        .exists()
    )


def desktop_step_slot_free(*, desktop_id: str, holder: str) -> None:
    Desktop.objects.filter(id=desktop_id, step_holder=holder).update(step_until=None, step_holder="")


def desktop_progress(desktop: Desktop, step: str) -> None:
    """Show which provision step is under way, live, while the desktop is being made."""
    if Desktop.objects.filter(id=desktop.id, state__in=(S.PROVISIONING, S.STARTING)).update(progress=step):
        desktop.progress = step
        publish_state_change(DesktopStateChanged.of(desktop))


def desktop_run_step(*, desktop_id: str, action: str) -> bool:
    """Carry out one step for a desktop already moved to the step's transitional state; True once done.

    Anything else (row gone, step already done, superseded by a destroy) is a no-op,
    which makes redelivered tasks harmless. Transient driver errors propagate so the
    task retries; permanent ones put the desktop in `error` with the driver's words.
    """
    step = TRANSITIONS[action]
    desktop = Desktop.objects.select_related("plan").filter(id=desktop_id).first()
    if desktop is None or desktop.state != step.via:
        logger.info("skip %s of %s: state is %s", action, desktop_id, desktop and desktop.state)
        return False
    driver = engine(desktop.driver)
    try:
        if action == "destroy":
            driver.destroy(desktop.id)
            # Its token dies with it: nothing that kept a copy can act for it any more.
            return transition(
                desktop_id=desktop.id,
                sources={step.via},
                target=step.target,
                actor=SYSTEM,
                private_ip=None,
                agent_token_hash="",
            )
        # A desktop whose first provision failed has no instance yet: starting it provisions it.
        fresh = action == "provision" or not desktop.driver_ref
        if fresh:
            # Recorded before the engine starts building, so that reconcile knows whose it is meanwhile.
            Desktop.objects.filter(id=desktop.id).update(engine_instance=driver.instance_id)
            spec, token_hash = instance_spec(desktop)
            status = driver.provision(spec, progress=lambda step: desktop_progress(desktop, step))
            # A new instance has new host keys and a new helper token.
            first_boot = {
                "ssh_host_key": "",
                "agent_token_hash": token_hash,
                "image": driver.image_metadata(desktop.id),
            }
        else:
            status, first_boot = getattr(driver, action)(desktop.id), {}
    except DriverError as exc:
        if exc.transient:
            raise
        message = engine_failure(exc, action)
        desktop_step_failed(desktop_id=desktop.id, action=action, message=message, detail=exc.message)
        return False
    done = transition(
        desktop_id=desktop.id,
        sources={step.via},
        target=step.target,
        actor=SYSTEM,
        private_ip=status.private_ip,
        driver_ref=status.ref or desktop.id,
        last_error="",
        error_detail="",
        progress="",
        **first_boot,
    )
    if not done and action == "provision":
        # A destroy overtook this provision; make sure what was just built does not outlive it.
        driver.destroy(desktop.id)
    return done


STEP_FAILED = {
    "provision": _("The desktop could not be created."),
    "start": _("The desktop could not be started."),
    "stop": _("The desktop could not be stopped."),
    "suspend": _("The desktop could not be suspended."),
    "resume": _("The desktop could not be resumed."),
    "destroy": _("The desktop could not be destroyed."),
}


# What the desktop's owner is told of an engine's failure whose cause they can act on.
ENGINE_REASONS = {
    NO_CAPACITY: _("There is no room for this desktop on the compute engine right now: try again later."),
    INVALID_SPEC: _("The compute engine cannot build a desktop of this name or plan."),
    IMAGE_MISSING: _("This desktop's image is not available on the compute engine; the operators were told."),
    NOT_SUSPENDABLE: _("The desktop is stopped: there is nothing in memory to suspend."),
    NOT_RESUMABLE: _("The desktop is stopped, not suspended: start it instead."),
    NOT_PROVISIONED: _("The desktop was never fully made: destroy it and create it again."),
}


def engine_failure(exc: DriverError, action: str) -> str:
    """What the desktop's owner reads of an engine's failure: never the engine's own words, which may
    name the host's paths or the cluster's nodes and storage."""
    if exc.reason in ENGINE_REASONS:
        return f"{STEP_FAILED[action]} {ENGINE_REASONS[exc.reason]}"
    return f"{STEP_FAILED[action]} {_('The compute engine failed; the operators have the details.')}"


def desktop_step_failed(*, desktop_id: str, action: str, message: str, detail: str = "") -> None:
    """Record a failed step; a failed provision first removes whatever it had built.

    `message` is shown to the desktop's owner; `detail` (the engine's own words, which may name the
    host's paths or the cluster's nodes) goes to the log and to what support staff see.
    """
    step = TRANSITIONS[action]
    desktop = Desktop.objects.filter(id=desktop_id).values("driver", "driver_ref").first()
    if desktop is None:
        return
    if action != "destroy" and not desktop["driver_ref"]:  # never provisioned: leave nothing behind
        try:
            engine(desktop["driver"]).destroy(desktop_id)
        except DriverError as exc:
            detail = f"{detail} (clean-up pending: {exc.message})"
    if detail:
        logger.warning("%s of %s failed: %s", action, desktop_id, detail)
    transition(
        desktop_id=desktop_id,
        sources={step.via},
        target=S.ERROR,
        actor=SYSTEM,
        reason=message,
        last_error=message,
        error_detail=detail,
    )


# What becomes of a desktop whose step has been under way past LIFECYCLE_STUCK_AFTER with no worker on it.
STUCK = _("The %(step)s step did not finish (its worker was lost); check the desktop and try again.")
VANISHED = _("The desktop's machine no longer exists on the compute engine.")
RESTARTED = _("The desktop was stopped outside Le Bureau (its host restarted?): it is started again.")
LOST = _("The desktop was stopped outside Le Bureau (its host restarted?): what it held in memory is lost.")


def reconcile() -> dict[str, list[str]]:
    """Compare each engine installation this process reaches with the database.

    A desktop the engine no longer has goes to `error`; a running desktop found stopped (its host
    restarted) is started again, a suspended one is recorded as stopped; a step with no worker on it past
    LIFECYCLE_REQUEUE_AFTER is sent again (its task may have been lost), and past LIFECYCLE_STUCK_AFTER
    ends in the state the engine shows, or in `error` with a reason; drift is reported. Instances the
    database does not know are reported, then removed once they have been seen for ORPHAN_GRACE.
    Each control plane judges only the desktops of the engine installations it can see.
    """
    report: dict[str, list[str]] = {
        "drift": [],
        "vanished": [],
        "restarted": [],
        "requeued": [],
        "stuck": [],
        "orphans": [],
        "removed": [],
    }
    for name in engines_in_use():
        _reconcile_engine(name, report)
    return report


def _reconcile_engine(name: str, report: dict[str, list[str]]) -> None:
    driver = engine(name)
    instances = {i.key: i for i in driver.list_instances()}
    live = Desktop.objects.exclude(state=S.DESTROYED).filter(driver=name)
    # Desktops made before engines named their installation are judged once found on this one.
    mine = live.filter(engine_instance__in=(driver.instance_id, ""))
    now = timezone.now()
    for desktop in mine.only(
        "id", "state", "engine_instance", "state_changed_at", "step_until", "driver_ref"
    ):
        instance = instances.get(desktop.id)
        if not desktop.engine_instance:
            if instance is None:
                continue
            Desktop.objects.filter(id=desktop.id).update(engine_instance=driver.instance_id)
        if desktop.state in STEADY:
            _reconcile_steady(desktop, instance, report)
        elif step_waiting_since(desktop, now, settings.LIFECYCLE_STUCK_AFTER):
            _reconcile_stuck(driver, desktop, instance, report)
        elif step_waiting_since(desktop, now, settings.LIFECYCLE_REQUEUE_AFTER):
            # Its task may have been lost with the broker's memory: send another; copies wait their turn.
            enqueue_step(desktop_id=desktop.id, action=STEPS_BY_VIA[desktop.state])
            report["requeued"].append(desktop.id)
    known = set(live.values_list("id", flat=True))  # every installation's: never remove what is known
    for key in instances.keys() - known:
        _reconcile_orphan(driver, key, now, report)


def _reconcile_steady(
    desktop: Desktop, instance: InstanceStatus | None, report: dict[str, list[str]]
) -> None:
    if instance is None or instance.state == InstanceState.ABSENT:
        report["vanished"].append(desktop.id)
        message = str(VANISHED)
        transition(
            desktop_id=desktop.id,
            sources={desktop.state},
            target=S.ERROR,
            actor=SYSTEM,
            reason=message,
            last_error=message,
        )
    elif instance.state == InstanceState.STOPPED and desktop.state in (S.RUNNING, S.SUSPENDED):
        # Stopped behind the control plane's back (the host restarted): a running desktop is brought
        # back, a suspended one has lost its memory and is stopped.
        report["restarted" if desktop.state == S.RUNNING else "drift"].append(desktop.id)
        if desktop.state == S.RUNNING:
            if transition(
                desktop_id=desktop.id,
                sources={S.RUNNING},
                target=S.STARTING,
                actor=SYSTEM,
                reason=str(RESTARTED),
            ):
                enqueue_step(desktop_id=desktop.id, action="start")
        else:
            transition(
                desktop_id=desktop.id, sources={S.SUSPENDED}, target=S.STOPPED, actor=SYSTEM, reason=str(LOST)
            )
    elif instance.state != STEADY[desktop.state]:
        report["drift"].append(desktop.id)
        logger.warning(
            "drift: %s is %s in the database but %s on the engine", desktop.id, desktop.state, instance.state
        )


def step_waiting_since(desktop: Desktop, now, seconds: float) -> bool:
    """Whether the desktop has been in a step for `seconds` with no worker on it now."""
    under_way = desktop.step_until is not None and desktop.step_until > now
    overdue = desktop.state_changed_at < now - timedelta(seconds=seconds)
    return desktop.state in STEPS_BY_VIA and overdue and not under_way


def _reconcile_stuck(
    driver: ComputeDriver, desktop: Desktop, instance: InstanceStatus | None, report: dict[str, list[str]]
) -> None:
    action = STEPS_BY_VIA[desktop.state]
    step = TRANSITIONS[action]
    report["stuck"].append(desktop.id)
    if action == "destroy":
        driver.destroy(desktop.id)
        transition(
            desktop_id=desktop.id, sources={step.via}, target=step.target, actor=SYSTEM, private_ip=None
        )
    elif instance is not None and instance.state == STEADY[step.target] and desktop.driver_ref:
        # The engine did the step; only its worker's last write was lost.
        transition(
            desktop_id=desktop.id,
            sources={step.via},
            target=step.target,
            actor=SYSTEM,
            private_ip=instance.private_ip,
            progress="",
        )
    else:
        desktop_step_failed(desktop_id=desktop.id, action=action, message=str(STUCK % {"step": action}))


def _reconcile_orphan(driver: ComputeDriver, key: str, now, report: dict[str, list[str]]) -> None:
    report["orphans"].append(key)
    first_seen = (
        AuditEvent.objects.filter(action="reconcile.orphan", target=key)
        .order_by("at")
        .values_list("at", flat=True)
    ).first()
    if first_seen is None:
        logger.warning("orphan instance %s has no live desktop", key)
        audit_record(actor=SYSTEM, action="reconcile.orphan", target=key, engine=driver.instance_id)
    elif first_seen < now - timedelta(seconds=settings.ORPHAN_GRACE):
        driver.destroy(key)
        report["removed"].append(key)
        audit_record(actor=SYSTEM, action="reconcile.orphan_removed", target=key, engine=driver.instance_id)
