"""The Proxmox VE engine: desktops as QEMU/KVM VMs on a cluster (see ``driver``)."""

from workers.drivers.proxmox.config import PoolShape, ProxmoxConfig
from workers.drivers.proxmox.driver import ProxmoxDriver

__all__ = ["PoolShape", "ProxmoxConfig", "ProxmoxDriver"]
