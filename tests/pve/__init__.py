"""A stateful Proxmox VE API simulator for the driver's tests and bench (no Proxmox exists here)."""
