"""The LXC compute driver: each desktop is an unprivileged system container on this machine.

Layout of one desktop ``key`` (all paths configurable through the constructor):

- ``<state_dir>/<key>/meta.json``: what the driver knows (address, image, egress policy);
- ``<state_dir>/<key>/disk.img``: a sparse ext4 image of the plan's disk size, loop-mounted on
  ``disk/``; its ``upper/`` directory is the upper layer of the desktop's overlay, so everything the
  desktop writes lands there and writing past the cap is ENOSPC inside, never a full host;
- ``<state_dir>/<key>/rootfs/``: the overlay (golden image below, ``upper/`` above) mounted by the
  host and handed to LXC as a plain directory;
- ``<lxc_path>/<key>/config``: the container (uid/gid mapped at ``id_base``, cgroup caps, a veth on
  the project's bridge with a static address from the injected allocator).

Every method that changes a desktop takes its file lock, so two workers acting on one desktop
serialise; the firewall is re-rendered under a host-wide lock (see ``lxc_net``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import ipaddress
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Protocol

from workers.drivers import lxc_net
from workers.drivers.base import (
    ComputeDriver,
    DriverError,
    InstanceSpec,
    InstanceState,
    InstanceStatus,
    InstanceUsage,
    NetworkPolicy,
    Progress,
    ProvisionStep,
    TransientDriverError,
    check_spec,
    guest_hostname,
    no_progress,
)

MARKER = "# managed-by: lebureau"
AGENT_UID = 1000
# What each port must answer first for the desktop to count as usable.
BANNERS = {22: b"SSH-", 5900: b"RFB "}
LXC_STATES = {
    "RUNNING": InstanceState.RUNNING,
    "STARTING": InstanceState.RUNNING,
    "THAWED": InstanceState.RUNNING,
    "FROZEN": InstanceState.SUSPENDED,
    "FREEZING": InstanceState.SUSPENDED,
}


class IpAllocator(Protocol):
    def allocate(self, key: str) -> str: ...

    def release(self, key: str) -> None: ...


class LxcDriver(ComputeDriver):
    name = "lxc"

    def __init__(
        self,
        *,
        ip_allocator: IpAllocator,
        images_dir: str = "/var/lib/lebureau/images",
        state_dir: str = "/var/lib/lebureau/desktops",
        lxc_path: str = "/var/lib/lebureau/lxc",
        lock_dir: str = "/run/lebureau/locks",
        bridge: str = "lbbr0",
        subnet: str = "10.213.0.0/24",
        nft_table: str = lxc_net.TABLE,
        veth_prefix: str = lxc_net.VETH_PREFIX,
        id_base: int = 100000,
        id_count: int = 65536,
        host_tcp_ports: tuple[int, ...] = (8000,),
        dns_servers: tuple[str, ...] | None = None,
        ready_ports: tuple[int, ...] = (22, 5900),
        ready_timeout: float = 30.0,
        stop_timeout: int = 10,
    ):
        self.ip_allocator = ip_allocator
        self.images_dir = Path(images_dir)
        self.state_dir = Path(state_dir)
        self.lxc_path = Path(lxc_path)
        self.lock_dir = Path(lock_dir)
        self.bridge = bridge
        self.nft_table = nft_table
        if not re.fullmatch(r"[a-z][a-z0-9]{1,4}", veth_prefix):
            raise ValueError(f"veth_prefix {veth_prefix!r}: 2 to 5 lowercase letters or digits")
        self.veth_prefix = veth_prefix
        self.subnet = ipaddress.ip_network(subnet)
        self.gateway = lxc_net.gateway_of(subnet)
        self.id_base = id_base
        self.id_count = id_count
        # TCP ports of the host that desktops may open (the control plane's callback API).
        self.host_tcp_ports = host_tcp_ports
        self.dns_servers = dns_servers if dns_servers is not None else _host_nameservers()
        self.ready_ports = ready_ports
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        for directory in (self.state_dir, self.lxc_path, self.lock_dir):
            directory.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_settings(cls) -> LxcDriver:
        # Django only here, so the driver itself stays importable (and testable) without it.
        from django.conf import settings

        from workers.ip_pool import DatabaseIpAllocator

        return cls(
            ip_allocator=DatabaseIpAllocator(settings.LXC_SUBNET),
            images_dir=settings.LXC_IMAGES_DIR,
            state_dir=settings.LXC_STATE_DIR,
            lxc_path=settings.LXC_PATH,
            bridge=settings.LXC_BRIDGE,
            subnet=settings.LXC_SUBNET,
            nft_table=settings.LXC_NFT_TABLE,
            veth_prefix=settings.LXC_VETH_PREFIX,
            host_tcp_ports=settings.LXC_HOST_TCP_PORTS,
        )

    # -- the interface ------------------------------------------------------------------------

    def provision(self, spec: InstanceSpec, progress: Progress = no_progress) -> InstanceStatus:
        key = _checked(spec.key)
        check_spec(spec, min_memory_mib=128)
        with self._locked(key):
            progress(ProvisionStep.CLONE)
            meta = self._read_meta(key)
            if meta is None:
                meta = self._new_meta(spec)
            self._write_lxc_config(spec, meta)
            self._ensure_disk(key, spec.disk_gib)
            self._mount(key, meta)
            progress(ProvisionStep.NETWORK)
            self._sync_network()
            progress(ProvisionStep.KEYS)
            if not (self._dir(key) / "seeded").exists():
                self._seed(spec, meta)
                (self._dir(key) / "seeded").touch()
            progress(ProvisionStep.BOOT)
            state = self._lxc_state(key)
            if state == InstanceState.SUSPENDED:
                self._lxc("lxc-unfreeze", key)
            elif state == InstanceState.STOPPED:
                self._lxc_start(key)
            self._wait_ready(key, meta["ip"])
            progress(ProvisionStep.READY)
            return self._status(key)

    def start(self, key: str) -> InstanceStatus:
        key = _checked(key)
        with self._locked(key):
            meta = self._existing_meta(key, "start")
            state = self._lxc_state(key)
            if state == InstanceState.SUSPENDED:
                self._lxc("lxc-unfreeze", key)
            elif state == InstanceState.STOPPED:
                if not (self._dir(key) / "seeded").exists():
                    raise DriverError(f"desktop {key} was never fully provisioned: provision it again")
                self._sync_network()
                self._mount(key, meta)
                self._lxc_start(key)
                self._wait_ready(key, meta["ip"])
            return self._status(key)

    def stop(self, key: str) -> InstanceStatus:
        key = _checked(key)
        with self._locked(key):
            self._existing_meta(key, "stop")
            self._lxc_stop(key, force=False)
            self._unmount(key, required=False)
            return self._status(key)

    def suspend(self, key: str) -> InstanceStatus:
        key = _checked(key)
        with self._locked(key):
            self._existing_meta(key, "suspend")
            state = self._lxc_state(key)
            if state == InstanceState.STOPPED:
                raise DriverError(f"desktop {key} is stopped: there is nothing in memory to suspend")
            if state == InstanceState.RUNNING:
                self._lxc("lxc-freeze", key)
            return self._status(key)

    def resume(self, key: str) -> InstanceStatus:
        key = _checked(key)
        with self._locked(key):
            self._existing_meta(key, "resume")
            state = self._lxc_state(key)
            if state == InstanceState.STOPPED:
                raise DriverError(f"desktop {key} is stopped, not suspended: start it instead")
            if state == InstanceState.SUSPENDED:
                self._lxc("lxc-unfreeze", key)
            return self._status(key)

    def destroy(self, key: str) -> None:
        key = _checked(key)
        with self._locked(key):
            if self._config_path(key).exists():
                self._lxc_stop(key, force=True)
                shutil.rmtree(self.lxc_path / key)
            self._unmount(key, required=True)
            if self._dir(key).exists():
                shutil.rmtree(self._dir(key))
            try:
                self.ip_allocator.release(key)
            except DriverError:
                raise
            except Exception as exc:
                raise TransientDriverError(f"could not release the address of desktop {key}: {exc}") from exc
            self._sync_network()

    def status(self, key: str) -> InstanceStatus:
        key = _checked(key)
        return self._status(key)

    def usage(self, key: str) -> InstanceUsage | None:
        """From the container's cgroup (v1 or v2): memory in use and CPU time since it started."""
        key = _checked(key)
        v1_memory = Path(f"/sys/fs/cgroup/memory/lxc.payload.{key}/memory.usage_in_bytes")
        v1_cpu = Path(f"/sys/fs/cgroup/cpuacct/lxc.payload.{key}/cpuacct.usage")
        v2 = Path(f"/sys/fs/cgroup/lxc.payload.{key}")
        try:
            if v1_memory.exists():
                return InstanceUsage(int(v1_memory.read_text()), int(v1_cpu.read_text()) / 1e9)
            stat = dict(line.split() for line in (v2 / "cpu.stat").read_text().splitlines())
            return InstanceUsage(int((v2 / "memory.current").read_text()), int(stat["usage_usec"]) / 1e6)
        except (OSError, KeyError, ValueError):
            return None  # stopped, or gone between the check and the read

    def image_metadata(self, key: str) -> dict:
        """The ``image.json`` of the golden image build the desktop was cloned from (LXC only)."""
        meta = self._existing_meta(_checked(key), "describe the image of")
        return json.loads((Path(meta["image"]) / "image.json").read_text())

    def list_instances(self) -> list[InstanceStatus]:
        instances = []
        for config in sorted(self.lxc_path.glob("*/config")):
            if config.read_text().startswith(MARKER):
                instances.append(self._status(config.parent.name))
        return [i for i in instances if i.state != InstanceState.ABSENT]

    def apply_network_policy(self, key: str, policy: NetworkPolicy) -> None:
        key = _checked(key)
        if policy.allowed_domains:
            raise DriverError(
                "the LXC engine cannot allow domains by name; allow their addresses as CIDRs instead"
            )
        cidrs = []
        for cidr in policy.allowed_cidrs:
            try:
                cidrs.append(str(ipaddress.IPv4Network(cidr, strict=False)))
            except ValueError as exc:
                raise DriverError(f"allowed CIDR {cidr!r} is not an IPv4 network: {exc}") from exc
        with self._locked(key):
            meta = self._existing_meta(key, "change the network policy of")
            meta["allow_internet"] = policy.allow_internet
            meta["allowed_cidrs"] = cidrs
            self._write_meta(key, meta)
            self._sync_network()

    # -- state --------------------------------------------------------------------------------

    def _dir(self, key: str) -> Path:
        return self.state_dir / key

    def _config_path(self, key: str) -> Path:
        return self.lxc_path / key / "config"

    def _status(self, key: str) -> InstanceStatus:
        meta = self._read_meta(key)
        if meta is None or not self._config_path(key).exists():
            return InstanceStatus(key=key, state=InstanceState.ABSENT)
        return InstanceStatus(key=key, state=self._lxc_state(key), private_ip=meta["ip"], ref=key)

    def _read_meta(self, key: str) -> dict | None:
        try:
            return json.loads((self._dir(key) / "meta.json").read_text())
        except FileNotFoundError:
            return None

    def _write_meta(self, key: str, meta: dict) -> None:
        path = self._dir(key) / "meta.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta, indent=2))
        tmp.replace(path)

    def _all_meta(self) -> list[dict]:
        metas = []
        for path in self.state_dir.glob("*/meta.json"):
            # A desktop being destroyed at the same moment is simply not counted.
            with contextlib.suppress(OSError, ValueError):
                metas.append(json.loads(path.read_text()))
        return metas

    def _existing_meta(self, key: str, action: str) -> dict:
        meta = self._read_meta(key)
        if meta is None or not self._config_path(key).exists():
            raise DriverError(f"cannot {action} desktop {key}: it does not exist on this host")
        return meta

    def _new_meta(self, spec: InstanceSpec) -> dict:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,31}", spec.image_profile):
            raise DriverError(f"{spec.image_profile!r} is not an image profile name")
        image = self.images_dir / spec.image_profile / "current"
        if not (image / "image.json").is_file() or not (image / "rootfs").is_dir():
            raise DriverError(
                f"the golden image '{spec.image_profile}' is not built on this host "
                f"(no {image}/rootfs): run image-build/build.sh {spec.image_profile}"
            )
        image_id_base = json.loads((image / "image.json").read_text()).get("id_base")
        if image_id_base != self.id_base:
            raise DriverError(
                f"the '{spec.image_profile}' image is owned by ids from {image_id_base}, but this driver "
                f"maps containers at {self.id_base}: rebuild it with LEBUREAU_ID_BASE={self.id_base}"
            )
        try:
            ip = self.ip_allocator.allocate(spec.key)
        except DriverError:
            raise
        except Exception as exc:
            raise TransientDriverError(
                f"could not allocate an address for desktop {spec.key}: {exc}"
            ) from exc
        try:
            address = ipaddress.ip_address(ip)
        except ValueError as exc:
            raise DriverError(f"the allocator gave {ip!r}, which is not an IP address") from exc
        if (
            address not in self.subnet
            or str(address) == self.gateway
            or address == self.subnet.broadcast_address
        ):
            raise DriverError(f"the allocator gave {ip}, which is not a desktop address of {self.subnet}")
        holder = next((m["key"] for m in self._all_meta() if m["ip"] == str(address)), None)
        if holder is not None:
            raise DriverError(f"the allocator gave {ip} to desktop {spec.key}, but desktop {holder} has it")
        digest = hashlib.sha256(spec.key.encode()).hexdigest()
        meta = {
            "key": spec.key,
            "ip": str(address),
            # Pin the image build: the overlay's lower layer must never change under the desktop.
            "image": str(image.resolve()),
            "profile": spec.image_profile,
            # Interface names have at most 15 characters.
            "veth": f"{self.veth_prefix}{digest[: 15 - len(self.veth_prefix)]}",
            "hwaddr": "00:16:3e:" + ":".join(digest[i : i + 2] for i in (12, 14, 16)),
            "allow_internet": True,
            "allowed_cidrs": [],
        }
        self._dir(spec.key).mkdir(parents=True, exist_ok=True)
        self._write_meta(spec.key, meta)
        return meta

    @contextlib.contextmanager
    def _locked(self, key: str):
        with open(self.lock_dir / f"{key}.lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    # -- disk and overlay ---------------------------------------------------------------------

    def _ensure_disk(self, key: str, disk_gib: int) -> None:
        image = self._dir(key) / "disk.img"
        if image.exists():
            return
        # Formatted under a temporary name, so a crash never leaves a half-made disk behind.
        tmp = image.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.truncate(disk_gib * 1024**3)
        _run(
            [
                "mkfs.ext4",
                "-q",
                "-F",
                "-m",
                "0",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1,nodiscard",
                str(tmp),
            ],
            f"could not format the disk of desktop {key}",
        )
        tmp.replace(image)

    def _mount(self, key: str, meta: dict) -> None:
        base = self._dir(key)
        disk, rootfs = base / "disk", base / "rootfs"
        disk.mkdir(exist_ok=True)
        rootfs.mkdir(exist_ok=True)
        mounted = _mountpoints()
        if str(disk) not in mounted:
            _run(
                ["mount", "-o", "loop", str(base / "disk.img"), str(disk)],
                f"could not mount the disk of {key}",
            )
        for name in ("upper", "work"):
            (disk / name).mkdir(exist_ok=True)
        # The upper layer's root is the guest's "/", owned by the guest's (mapped) root.
        os.chown(disk / "upper", self.id_base, self.id_base)
        if str(rootfs) not in mounted:
            lower = Path(meta["image"]) / "rootfs"
            if not lower.is_dir():
                raise DriverError(
                    f"the image build {meta['image']} that desktop {key} was cloned from is gone"
                )
            options = f"lowerdir={lower},upperdir={disk / 'upper'},workdir={disk / 'work'}"
            _run(
                ["mount", "-t", "overlay", "overlay", "-o", options, str(rootfs)],
                f"could not mount the root of {key}",
            )

    def _unmount(self, key: str, required: bool) -> None:
        base = self._dir(key)
        for path in (base / "rootfs", base / "disk"):
            deadline = time.monotonic() + 5
            while str(path) in _mountpoints():
                result = lxc_net.run(["umount", str(path)])
                if result.returncode == 0:
                    break
                if time.monotonic() > deadline:
                    if not required:
                        # Still busy: left mounted, and start() reuses the mount as it is.
                        return
                    raise TransientDriverError(f"the disk of desktop {key} is busy: {result.stderr.strip()}")
                time.sleep(0.1)

    # -- what the guest gets at provision -----------------------------------------------------

    def _seed(self, spec: InstanceSpec, meta: dict) -> None:
        root = self._dir(spec.key) / "rootfs"
        hostname = guest_hostname(spec.hostname)
        agent_home = "/home/agent"
        with tempfile.TemporaryDirectory() as tmp:
            keyfile = os.path.join(tmp, "key")
            _run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{hostname}", "-f", keyfile],
                "could not generate the desktop's SSH host key",
            )
            host_key, host_key_pub = Path(keyfile).read_text(), Path(keyfile + ".pub").read_text()
        files: list[tuple[str, str, int, int]] = [
            ("/etc/hostname", f"{hostname}\n", 0o644, 0),
            ("/etc/hosts", f"127.0.0.1\tlocalhost\n127.0.1.1\t{hostname}\n::1\tlocalhost\n", 0o644, 0),
            ("/etc/resolv.conf", "".join(f"nameserver {s}\n" for s in self.dns_servers), 0o644, 0),
            ("/etc/machine-id", secrets.token_hex(16) + "\n", 0o444, 0),
            ("/etc/ssh/ssh_host_ed25519_key", host_key, 0o600, 0),
            ("/etc/ssh/ssh_host_ed25519_key.pub", host_key_pub, 0o644, 0),
            ("/root/.ssh/authorized_keys", spec.ssh_public_key.strip() + "\n", 0o600, 0),
            (f"{agent_home}/.ssh/authorized_keys", spec.ssh_public_key.strip() + "\n", 0o600, AGENT_UID),
            ("/etc/bureau/desktop_id", f"{spec.key}\n", 0o644, 0),
        ]
        for path, content in spec.files.items():
            # The bureau helper's files (its token) belong to the agent who runs it; root reads all.
            owner = AGENT_UID if path.startswith((f"{agent_home}/", "/etc/bureau/")) else 0
            mode = 0o600 if owner or path.startswith("/root/") else 0o644
            files.append((path, content, mode, owner))
        for path, content, mode, owner in files:
            self._put(root, path, content, mode, owner)

    def _put(self, root: Path, guest_path: str, content: str, mode: int, owner: int) -> None:
        """Write a file into the guest from the host without ever following a symlink out of it."""
        parts = Path(guest_path).parts
        if not guest_path.startswith("/") or ".." in parts or len(parts) < 2:
            raise DriverError(f"guest file path {guest_path!r} must be absolute and inside the guest")
        directory = root
        for part in parts[1:-1]:
            directory = directory / part
            if directory.is_symlink():
                raise DriverError(
                    f"cannot write {guest_path} into the guest: {directory.relative_to(root)} is a symlink"
                )
            if not directory.exists():
                directory.mkdir(mode=0o755)
                os.chown(directory, self.id_base + owner, self.id_base + owner)
        target = directory / parts[-1]
        if target.is_symlink():
            target.unlink()
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, mode)
        with os.fdopen(fd, "w") as f:
            f.write(content)
            os.fchown(f.fileno(), self.id_base + owner, self.id_base + owner)
            os.fchmod(f.fileno(), mode)

    def _write_lxc_config(self, spec: InstanceSpec, meta: dict) -> None:
        v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
        memory = spec.memory_mib * 1024 * 1024
        quota, period = spec.vcpus * 100_000, 100_000
        if v2:
            caps = [
                f"lxc.cgroup2.memory.max = {memory}",
                f"lxc.cgroup2.cpu.max = {quota} {period}",
                "lxc.cgroup2.pids.max = 4096",
            ]
        else:
            caps = [
                f"lxc.cgroup.memory.limit_in_bytes = {memory}",
                f"lxc.cgroup.cpu.cfs_period_us = {period}",
                f"lxc.cgroup.cpu.cfs_quota_us = {quota}",
                "lxc.cgroup.pids.max = 4096",
            ]
        prefix = self.subnet.prefixlen
        lines = [
            MARKER,
            f"lxc.uts.name = {guest_hostname(spec.hostname)}",
            f"lxc.rootfs.path = dir:{self._dir(spec.key) / 'rootfs'}",
            "lxc.include = /usr/share/lxc/config/common.conf",
            "lxc.include = /usr/share/lxc/config/userns.conf",
            f"lxc.idmap = u 0 {self.id_base} {self.id_count}",
            f"lxc.idmap = g 0 {self.id_base} {self.id_count}",
            "lxc.net.0.type = veth",
            f"lxc.net.0.link = {self.bridge}",
            "lxc.net.0.flags = up",
            "lxc.net.0.name = eth0",
            f"lxc.net.0.veth.pair = {meta['veth']}",
            f"lxc.net.0.hwaddr = {meta['hwaddr']}",
            f"lxc.net.0.ipv4.address = {meta['ip']}/{prefix}",
            f"lxc.net.0.ipv4.gateway = {self.gateway}",
            # systemd shuts down cleanly on SIGRTMIN+3; LXC's default SIGPWR does nothing to it.
            "lxc.signal.halt = SIGRTMIN+3",
            "lxc.tty.max = 0",
            *caps,
            "",
        ]
        path = self._config_path(spec.key)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = "\n".join(lines)
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)

    # -- network ------------------------------------------------------------------------------

    def _sync_network(self) -> None:
        """Re-render the project's firewall from every desktop's metadata, under a host-wide lock."""
        with self._locked(".network"):
            desktops = [
                lxc_net.DesktopRules(
                    meta["ip"], meta["veth"], meta["allow_internet"], tuple(meta["allowed_cidrs"])
                )
                for meta in self._all_meta()
            ]
            try:
                lxc_net.ensure_bridge(self.bridge, str(self.subnet))
                lxc_net.apply(
                    lxc_net.render_ruleset(
                        self.bridge,
                        str(self.subnet),
                        desktops,
                        self.host_tcp_ports,
                        self.nft_table,
                        self.veth_prefix,
                    )
                )
            except RuntimeError as exc:
                raise DriverError(f"could not set up the desktops' network: {exc}") from exc

    # -- lxc ----------------------------------------------------------------------------------

    def _lxc(self, command: str, key: str, *args: str) -> subprocess.CompletedProcess:
        result = lxc_net.run([command, "-n", key, "-P", str(self.lxc_path), *args])
        if result.returncode != 0:
            raise DriverError(
                f"{command} failed for desktop {key}: {result.stderr.strip() or result.stdout.strip()}"
            )
        return result

    def _lxc_state(self, key: str) -> InstanceState:
        state = self._lxc("lxc-info", key, "-s", "-H").stdout.strip()
        return LXC_STATES.get(state, InstanceState.STOPPED)

    def _lxc_start(self, key: str) -> None:
        log = self._dir(key) / "lxc.log"
        log.unlink(missing_ok=True)
        result = lxc_net.run(
            ["lxc-start", "-n", key, "-P", str(self.lxc_path), "-d", "-o", str(log), "-l", "WARN"]
        )
        if result.returncode != 0:
            detail = log.read_text()[-1500:] if log.exists() else result.stderr
            raise DriverError(f"desktop {key} failed to start: {detail.strip()}")

    def _lxc_stop(self, key: str, force: bool) -> None:
        state = self._lxc_state(key)
        if state == InstanceState.STOPPED:
            return
        if state == InstanceState.SUSPENDED:
            # A frozen init cannot handle the halt signal.
            self._lxc("lxc-unfreeze", key)
        args = ["-k"] if force else ["-t", str(self.stop_timeout)]
        self._lxc("lxc-stop", key, *args)

    def _wait_ready(self, key: str, ip: str) -> None:
        # The address may have belonged to a destroyed desktop with another MAC: without this the
        # host keeps sending to the old MAC until its neighbour entry goes stale (about 30 s).
        lxc_net.run(["ip", "neigh", "flush", "to", ip, "dev", self.bridge])
        deadline = time.monotonic() + self.ready_timeout
        pending = list(self.ready_ports)
        while pending:
            if _answers(ip, pending[0]):
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise TransientDriverError(
                    f"desktop {key} started but {ip}:{pending[0]} did not answer "
                    f"within {self.ready_timeout:.0f} s"
                )
            time.sleep(0.05)


def _answers(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.5) as conn:
            conn.settimeout(2)
            return conn.recv(16).startswith(BANNERS.get(port, b""))
    except OSError:
        return False


def _checked(key: str) -> str:
    # Keys become container names, paths and lock files: refuse anything that could escape them.
    if (
        not key
        or len(key) > 64
        or not all(c.isascii() and (c.isalnum() or c in "_-") for c in key)
        or key[0] in "-_"
    ):
        raise DriverError(f"{key!r} is not a valid desktop key (letters, digits, '_' and '-', at most 64)")
    return key


def _mountpoints() -> set[str]:
    with open("/proc/self/mountinfo") as f:
        # Field 5 is the mount point, with spaces and the like escaped in octal.
        return {line.split()[4].encode().decode("unicode_escape") for line in f}


def _host_nameservers() -> tuple[str, ...]:
    servers = []
    with contextlib.suppress(OSError), open("/etc/resolv.conf") as f:
        for line in f:
            fields = line.split()
            if len(fields) >= 2 and fields[0] == "nameserver" and not fields[1].startswith("127."):
                servers.append(fields[1])
    return tuple(servers)


def _run(command: list[str], what: str) -> None:
    result = lxc_net.run(command)
    if result.returncode != 0:
        raise DriverError(f"{what}: {result.stderr.strip() or f'exit code {result.returncode}'}")
