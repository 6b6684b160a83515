"""The Proxmox VE engine: desktops as QEMU/KVM VMs on a cluster (see ``driver``)."""

from workers.drivers.base import PoolShape
from workers.drivers.proxmox.config import ProxmoxConfig
from workers.drivers.proxmox.driver import ProxmoxDriver

__all__ = ["PoolShape", "ProxmoxConfig", "ProxmoxDriver"]
