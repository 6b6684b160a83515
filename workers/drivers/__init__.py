"""The registry of compute engines; `COMPUTE_DRIVER` picks one by name or dotted path."""

from functools import cache

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from workers.drivers.base import ComputeDriver

DRIVERS: dict[str, str] = {
    "lxc": "workers.drivers.lxc.LxcDriver",
    "proxmox": "workers.drivers.proxmox.ProxmoxDriver",
}


def driver_name() -> str:
    """The engine new desktops go to, recorded on each so it keeps its engine for life."""
    return settings.COMPUTE_DRIVER


@cache
def get_driver(name: str | None = None) -> ComputeDriver:
    """One driver instance per engine and process, built from settings."""
    name = name or settings.COMPUTE_DRIVER
    path = DRIVERS.get(name, name)
    try:
        driver_class = import_string(path)
    except ImportError as exc:
        known = ", ".join(sorted(DRIVERS))
        raise ImproperlyConfigured(
            f"COMPUTE_DRIVER={name!r} is not available ({exc}); known: {known}."
        ) from exc
    return driver_class.from_settings()
