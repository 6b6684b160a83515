"""The domain's door to the compute engines: faces ask here, never an engine directly.

A desktop keeps the engine it was made on for life (``Desktop.driver``); new desktops go to
``COMPUTE_DRIVER``. Each engine is built once per process, from its own environment variables.
The engines' types a face may need (``ConsoleTicket``, ``TransientDriverError``) are named from here.
"""

from __future__ import annotations

import logging
from functools import cache
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from desktops.errors import Unavailable
from desktops.models import Desktop, DesktopState
from workers.drivers import DRIVERS, driver_class
from workers.drivers.base import (
    BlockedEgress,
    ComputeDriver,
    ConsoleTicket,
    ControlPlane,
    DriverError,
    InstanceUsage,
)
from workers.drivers.base import TransientDriverError as TransientDriverError  # for the faces

logger = logging.getLogger(__name__)


def engine_for_new_desktops() -> str:
    """The engine new desktops go to, recorded on each so it keeps its engine for life."""
    return settings.COMPUTE_DRIVER


def engine_instance_for_new_desktops() -> str:
    """The installation of that engine (a host, a cluster) new desktops go to: reconcile judges a desktop
    only where it can see the installation that holds it."""
    return engine(engine_for_new_desktops()).instance_id


def engines_preload() -> None:
    """Import the engine new desktops go to, in a process about to fork its workers: each forked process
    would otherwise import it in its first step (a third of a second, as ten desktops are made at once)."""
    driver_class(engine_for_new_desktops())


def control_plane() -> ControlPlane:
    return ControlPlane(ssh_key_path=Path(settings.CONTROL_PLANE_SSH_KEY), ssh_user=settings.DESKTOP_SSH_USER)


@cache
def engine(name: str) -> ComputeDriver:
    """One driver per engine and process."""
    try:
        driver = driver_class(name)
    except ImportError as exc:
        known = ", ".join(sorted(DRIVERS))
        raise ImproperlyConfigured(
            f"COMPUTE_DRIVER={name!r} is not available ({exc}); known: {known}."
        ) from exc
    return driver.from_env(control_plane())


def engines_in_use() -> list[str]:
    """The engine of new desktops and every engine a live desktop is on."""
    live = Desktop.objects.exclude(state=DesktopState.DESTROYED).values_list("driver", flat=True)
    return sorted(set(live.distinct()) | {engine_for_new_desktops()})


def engines_maintain() -> dict[str, dict]:
    """Each engine's own periodic work; one engine failing does not stop the others'."""
    done = {}
    for name in engines_in_use():
        try:
            done[name] = engine(name).maintenance()
        except (ImproperlyConfigured, DriverError) as exc:
            logger.warning("maintenance of the %s engine failed: %s", name, exc)
            done[name] = {"error": str(exc)}
    return done


def desktop_resource_usage(desktop: Desktop) -> InstanceUsage | None:
    """What a running desktop uses now, if its engine is reachable from here and can tell."""
    if desktop.state != DesktopState.RUNNING:
        return None
    try:
        return engine(desktop.driver).usage(desktop.id)
    except (ImproperlyConfigured, DriverError):
        return None


def desktop_blocked_egress(desktop: Desktop) -> BlockedEgress | None:
    """What the desktop tried to reach and its policy refused, the latest first, if its engine can tell."""
    try:
        return engine(desktop.driver).blocked_egress(desktop.id)
    except (ImproperlyConfigured, DriverError) as exc:
        logger.warning("could not read what %s was refused: %s", desktop.id, exc)
        return None


def desktop_disk_usage(desktop: Desktop) -> int | None:
    """Bytes the desktop's disk holds now, as its engine measures them; None when it cannot tell now."""
    try:
        return engine(desktop.driver).disk_usage(desktop.id)
    except (ImproperlyConfigured, DriverError) as exc:
        logger.warning("could not measure the disk of %s: %s", desktop.id, exc)
        return None


def desktop_console(*, desktop_id: str) -> ConsoleTicket:
    """A one-time way to the desktop's screen through its engine, for when its own VNC server is down."""
    name = Desktop.objects.values_list("driver", flat=True).get(id=desktop_id)
    try:
        return engine(name).console(desktop_id)
    except (ImproperlyConfigured, DriverError) as exc:
        raise Unavailable(str(exc)) from exc
