"""The LXC engine: desktops as unprivileged system containers on this machine (see ``driver``)."""

from workers.drivers.lxc.config import LxcConfig
from workers.drivers.lxc.driver import LxcDriver

__all__ = ["LxcConfig", "LxcDriver"]
