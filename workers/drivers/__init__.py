"""The registry of compute engines: a name ("lxc", "proxmox") or a dotted path picks a driver class.

Engines know nothing of Django: each reads its own options from the environment (``from_env``).
"""

from importlib import import_module

from workers.drivers.base import ComputeDriver

DRIVERS: dict[str, str] = {
    "lxc": "workers.drivers.lxc.LxcDriver",
    "proxmox": "workers.drivers.proxmox.ProxmoxDriver",
}


def driver_class(name: str) -> type[ComputeDriver]:
    """The class registered under ``name``, or the one its dotted path names; ImportError if none."""
    module, _, attribute = DRIVERS.get(name, name).rpartition(".")
    try:
        found = getattr(import_module(module), attribute)
    except (ValueError, AttributeError) as exc:
        raise ImportError(f"no engine named {name!r}") from exc
    if not (isinstance(found, type) and issubclass(found, ComputeDriver)):
        raise ImportError(f"{name!r} is not a compute engine")
    return found
