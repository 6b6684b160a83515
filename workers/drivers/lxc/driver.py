"""The LXC compute driver: each desktop is an unprivileged system container on this machine.

Its disk (``storage``), its container (``container``), the files it gets at provision
(``guest_files``), the host's bridge and firewall (``network``) and what the engine keeps of it
(``state``) each have a module; this one puts them together behind ``ComputeDriver``. Every method
that changes a desktop takes its lock, so two workers acting on one desktop serialise; addresses and
the firewall change under one host-wide lock.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import re
import secrets
import shlex
import shutil
import socket
from pathlib import Path

from workers.drivers.base import (
    ALLOWED_DOMAIN,
    IMAGE_MISSING,
    NO_CAPACITY,
    NOT_PROVISIONED,
    NOT_RESUMABLE,
    NOT_SUSPENDABLE,
    BlockedDestination,
    BlockedEgress,
    ComputeDriver,
    ControlPlane,
    DriverError,
    InstanceSpec,
    InstanceState,
    InstanceStatus,
    InstanceUsage,
    NetworkPolicy,
    PoolShape,
    Progress,
    ProvisionStep,
    check_spec,
    guest_hostname,
    no_progress,
)
from workers.drivers.lxc import cgroups, guest_files, network, resolver, storage
from workers.drivers.lxc.config import LxcConfig
from workers.drivers.lxc.container import Lxc, is_ours, render_config, wait_ready, write_config
from workers.drivers.lxc.state import NETWORK_LOCK, DesktopStore, checked_key

logger = logging.getLogger(__name__)


class LxcDriver(ComputeDriver):
    name = "lxc"

    def __init__(self, config: LxcConfig, control_plane: ControlPlane | None = None):
        self.config = config
        # Warm pool desktops are booted before any create: they get the control plane's key from here.
        self.control_plane = control_plane
        self.store = DesktopStore(config.state_dir, config.lxc_path, config.lock_dir)
        self.lxc = Lxc(config.lxc_path, config.stop_timeout)

    @classmethod
    def from_env(cls, control_plane: ControlPlane) -> LxcDriver:
        return cls(LxcConfig.from_env(), control_plane)

    @property
    def instance_id(self) -> str:
        return f"lxc:{socket.gethostname()}:{self.config.state_dir}"

    # -- the interface ------------------------------------------------------------------------

    def provision(self, spec: InstanceSpec, progress: Progress = no_progress) -> InstanceStatus:
        key = checked_key(spec.key)
        check_spec(spec, min_memory_mib=128)
        with self.store.locked(key):
            meta = self.store.read(key)
            if meta is None or meta.get("pool"):  # a claim left half-done is finished
                claimed = self._pool_claim(spec, progress)
                if claimed is not None:
                    return claimed
            return self._build(spec, progress)

    def _build(self, spec: InstanceSpec, progress: Progress = no_progress, pool: str = "") -> InstanceStatus:
        """Clone, network, seed and boot the desktop (under its key's lock)."""
        key = spec.key
        progress(ProvisionStep.CLONE)
        meta = self.store.read(key) or self._new_meta(spec, pool)
        # From the first boot on, the desktop goes only where its policy lets it.
        meta.update(_policy_fields(spec.network_policy))
        self.store.write(key, meta)
        base = self.store.dir(key)
        write_config(self.store.config_path(key), render_config(self.config, spec, meta, base / "rootfs"))
        storage.ensure_disk(base, spec.disk_gib)
        storage.mount(base, meta["image"], self.config.id_base)
        progress(ProvisionStep.NETWORK)
        self._sync_network()
        self._ensure_resolver(meta)
        progress(ProvisionStep.KEYS)
        if not (base / "seeded").exists():
            gateway = network.gateway_of(self.config.subnet)
            guest_files.seed(base / "rootfs", spec, nameserver=gateway, id_base=self.config.id_base)
            (base / "seeded").touch()
        progress(ProvisionStep.BOOT)
        name = meta.get("container", key)
        self.lxc.thaw_or_start(name, base / "lxc.log")
        wait_ready(name, meta["ip"], self.config)
        progress(ProvisionStep.READY)
        return self._status(key)

    def start(self, key: str) -> InstanceStatus:
        key = checked_key(key)
        with self.store.locked(key):
            meta = self.store.existing(key, "start")
            base, name = self.store.dir(key), meta.get("container", key)
            if self.lxc.state(name) == InstanceState.STOPPED:
                if not (base / "seeded").exists():
                    raise DriverError(
                        f"desktop {key} was never fully provisioned: provision it again",
                        reason=NOT_PROVISIONED,
                    )
                self._sync_network()
                storage.mount(base, meta["image"], self.config.id_base)
            self._ensure_resolver(meta)
            if self.lxc.thaw_or_start(name, base / "lxc.log"):
                wait_ready(name, meta["ip"], self.config)
            return self._status(key)

    def stop(self, key: str) -> InstanceStatus:
        key = checked_key(key)
        with self.store.locked(key):
            meta = self.store.existing(key, "stop")
            self.lxc.stop(meta.get("container", key), force=False)
            storage.unmount(self.store.dir(key), required=False)
            resolver.stop(self.store.dir(key))
            return self._status(key)

    def suspend(self, key: str) -> InstanceStatus:
        key = checked_key(key)
        with self.store.locked(key):
            name = self.store.existing(key, "suspend").get("container", key)
            state = self.lxc.state(name)
            if state == InstanceState.STOPPED:
                raise DriverError(
                    f"desktop {key} is stopped: there is nothing in memory to suspend", reason=NOT_SUSPENDABLE
                )
            if state == InstanceState.RUNNING:
                self.lxc.tool("lxc-freeze", name)
            return self._status(key)

    def resume(self, key: str) -> InstanceStatus:
        key = checked_key(key)
        with self.store.locked(key):
            name = self.store.existing(key, "resume").get("container", key)
            state = self.lxc.state(name)
            if state == InstanceState.STOPPED:
                raise DriverError(
                    f"desktop {key} is stopped, not suspended: start it instead", reason=NOT_RESUMABLE
                )
            if state == InstanceState.SUSPENDED:
                self.lxc.tool("lxc-unfreeze", name)
            return self._status(key)

    def destroy(self, key: str) -> None:
        key = checked_key(key)
        with self.store.locked(key):
            self._destroy(key)

    def _destroy(self, key: str) -> None:
        """``destroy``, under the key's lock already."""
        name = self.store.container(key)
        if self.store.config_path(key).exists():
            self.lxc.stop(name, force=True)
            shutil.rmtree(self.config.lxc_path / name)
        storage.unmount(self.store.dir(key), required=True)
        resolver.stop(self.store.dir(key))
        # Its meta.json goes with it, and with it the lease on its address.
        self.store.forget(key)
        self._sync_network()

    def status(self, key: str) -> InstanceStatus:
        return self._status(checked_key(key))

    def usage(self, key: str) -> InstanceUsage | None:
        """From the container's cgroup (v1 or v2): memory in use and CPU time since it started."""
        found = cgroups.usage(f"lxc.payload.{self.store.container(checked_key(key))}")
        return None if found is None else InstanceUsage(*found)

    def blocked_egress(self, key: str) -> BlockedEgress | None:
        """From its resolver's log (names) and its set of refused addresses (with counts of packets)."""
        meta = self.store.read(checked_key(key))
        if meta is None:
            return None
        found = network.blocked_destinations(self.config.nft_table, meta["veth"])
        return BlockedEgress(
            names=tuple(resolver.refused_names(self.store.dir(key))),
            addresses=tuple(BlockedDestination(address, packets, ago) for address, packets, ago in found),
        )

    def disk_usage(self, key: str) -> int | None:
        """The space used in the desktop's disk image, while it is mounted."""
        return storage.used_bytes(self.store.dir(checked_key(key)))

    def image_metadata(self, key: str) -> dict:
        """The ``image.json`` of the golden image build the desktop was cloned from (LXC only)."""
        meta = self.store.existing(checked_key(key), "describe the image of")
        return json.loads((Path(meta["image"]) / "image.json").read_text())

    def list_instances(self) -> list[InstanceStatus]:
        """The desktops on this host, by key; the warm pool's are nobody's yet and not listed."""
        instances = []
        for config in sorted(self.config.lxc_path.glob("*/config")):
            meta = self.store.read(config.parent.name) if is_ours(config) else None
            if meta is not None and not meta.get("pool"):
                instances.append(self._status(meta["key"]))
            elif meta is None and is_ours(config):
                instances.append(self._status(config.parent.name))  # a record lost: ABSENT, dropped below
        return [i for i in instances if i.state != InstanceState.ABSENT]

    def apply_network_policy(self, key: str, policy: NetworkPolicy) -> None:
        key = checked_key(key)
        fields = _policy_fields(policy)
        with self.store.locked(key):
            meta = self.store.existing(key, "change the network policy of")
            changed = any(meta.get(name) != value for name, value in fields.items())
            if changed:
                meta.update(fields)
                self.store.write(key, meta)
                # The whole firewall, under the host-wide lock: only when this desktop's part changed
                # (a policy applied again, as after every provision, costs nothing then).
                self._sync_network()
            if self.lxc.state(meta.get("container", key)) != InstanceState.STOPPED:
                self._ensure_resolver(meta)  # restarted if the policy changed, so with nothing cached
            if changed:
                # What the former policy let it resolve goes with it.
                network.forget_allowed(self.config.nft_table, meta["veth"])

    def maintenance(self) -> dict:
        """Trim the resolvers' logs; restart those of desktops that are up but whose resolver died (or
        the host rebooted); refill the warm pool."""
        restarted = []
        for meta in self.store.all():
            key = meta["key"]
            resolver.trim_log(self.store.dir(key))
            up = self._status(key).state in (InstanceState.RUNNING, InstanceState.SUSPENDED)
            if up and not resolver.running(self.store.dir(key)):
                with self.store.locked(key):
                    self._ensure_resolver(meta)
                restarted.append(key)
        done = {"resolvers_restarted": restarted} if restarted else {}
        pool = self._pool_refill()
        return {**done, "warm_pool": pool} if pool else done

    # -- the warm pool ------------------------------------------------------------------------
    # Desktops of the configured shapes booted ahead of demand (their agent starts and warms up
    # meanwhile), with no tenant's data, egress closed. A create of the same shape takes one: it gets
    # the desktop's name, keys, files and egress policy written over it, in a second instead of a boot.

    def _pool_members(self, shape: PoolShape) -> list[dict]:
        return sorted((m for m in self.store.all() if m.get("pool") == shape.tag), key=lambda m: m["key"])

    def _pool_claim(self, spec: InstanceSpec, progress: Progress) -> InstanceStatus | None:
        """Take a running member of the pool for ``spec`` (under its key's lock); None if there is none."""
        shape = next((s for s in self.config.warm_pool if s.fits(spec)), None)
        half_done = self.store.read(spec.key)  # through the key's link: the member it was taking
        if half_done is not None:
            names = [half_done["key"]]
        else:
            names = [m["key"] for m in self._pool_members(shape)] if shape else []
        for name in names:
            with self.store.locked(name, wait=False) as mine:
                meta = self.store.read(name)
                # Another create took it first, or the refill is still booting it.
                if not mine or meta is None or not meta.get("pool"):
                    continue
                if self.lxc.state(name) != InstanceState.RUNNING:
                    continue
                progress(ProvisionStep.KEYS)
                # The key names the member from now on, so a retry after a crash finishes this claim.
                self.store.alias(spec.key, name)
                base = self.store.dir(spec.key)
                guest_files.assign(base / "rootfs", spec, id_base=self.config.id_base)
                # The screen's name too (a viewer's title), which Xvnc took from the hostname at boot;
                # one attach for both, on the path of a create.
                hostname = shlex.quote(guest_hostname(spec.hostname))
                rename = f"hostname {hostname} && DISPLAY=:0 vncconfig -set desktop={hostname}"
                self.lxc.tool("lxc-attach", name, "--", "sh", "-c", rename)
                del meta["pool"]
                meta.update(key=spec.key, container=name, **_policy_fields(spec.network_policy))
                self.store.write(spec.key, meta)
                # Its name and caps for its next boot, in the configuration the record now leads to.
                config = render_config(self.config, spec, meta, base / "rootfs")
                write_config(self.store.config_path(spec.key), config)
                progress(ProvisionStep.NETWORK)
                self._sync_network()
                self._ensure_resolver(meta)
                network.forget_allowed(self.config.nft_table, meta["veth"])
                progress(ProvisionStep.READY)
                return self._status(spec.key)
        return None

    def _pool_refill(self) -> dict[str, dict[str, int]]:
        """Boot the members each shape lacks; remove those beyond its size, those that are down (the
        host rebooted) and those of a shape no longer configured. How many were booted and removed."""
        changes: dict[str, dict[str, int]] = {}

        def count(tag: str, what: str, n: int) -> None:
            if n:
                changes.setdefault(tag, {})[what] = changes.get(tag, {}).get(what, 0) + n

        wanted = {shape.tag for shape in self.config.warm_pool}
        for meta in self.store.all():
            if meta.get("pool") and meta["pool"] not in wanted:
                count(meta["pool"], "removed", self._pool_remove(meta["key"]))
        for shape in self.config.warm_pool:
            members = self._pool_members(shape)
            down = [m for m in members if self.lxc.state(m["key"]) != InstanceState.RUNNING]
            up = [m for m in members if m not in down]
            count(shape.tag, "removed", sum(self._pool_remove(m["key"]) for m in down + up[shape.size :]))
            for _ in range(shape.size - len(up)):
                if self.control_plane is None:
                    break  # nothing to let the control plane in with
                key = f"lbpool-{secrets.token_hex(6)}"
                with self.store.locked(key):
                    try:
                        self._build(self._pool_spec(shape, key), pool=shape.tag)
                    except DriverError as exc:
                        logger.warning("warm pool %s not refilled: %s", shape.tag, exc.message)
                        self._destroy(key)
                        break
                count(shape.tag, "booted", 1)
        return changes

    def _pool_remove(self, name: str) -> int:
        with self.store.locked(name):
            meta = self.store.read(name)
            if meta is None or not meta.get("pool"):
                return 0  # taken meanwhile: a desktop now
            self._destroy(name)
            return 1

    def _pool_spec(self, shape: PoolShape, key: str) -> InstanceSpec:
        return InstanceSpec(
            key=key,
            hostname="desktop",
            vcpus=shape.vcpus,
            memory_mib=shape.memory_mib,
            disk_gib=shape.disk_gib,
            ssh_public_key=self.control_plane.ssh_public_key,
            image_profile=shape.profile,
            workspace="",
            # Nowhere until a create takes it: its agent warms up against the desktop itself.
            network_policy=NetworkPolicy(allow_internet=False),
        )

    # -- helpers ------------------------------------------------------------------------------

    def _status(self, key: str) -> InstanceStatus:
        meta = self.store.read(key)
        if meta is None or not self.store.config_path(key).exists():
            return InstanceStatus(key=key, state=InstanceState.ABSENT)
        state = self.lxc.state(meta.get("container", key))
        return InstanceStatus(key=key, state=state, private_ip=meta["ip"], ref=key)

    def _golden_image(self, profile: str) -> Path:
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,31}", profile):
            raise DriverError(f"{profile!r} is not an image profile name")
        image = self.config.images_dir / profile / "current"
        if not (image / "image.json").is_file() or not (image / "rootfs").is_dir():
            raise DriverError(
                f"the golden image '{profile}' is not built on this host "
                f"(no {image}/rootfs): run image-build/build.sh {profile}",
                reason=IMAGE_MISSING,
            )
        image_id_base = json.loads((image / "image.json").read_text()).get("id_base")
        if image_id_base != self.config.id_base:
            raise DriverError(
                f"the '{profile}' image is owned by ids from {image_id_base}, but this driver maps "
                f"containers at {self.config.id_base}: rebuild it with LEBUREAU_ID_BASE={self.config.id_base}"
            )
        return image

    def _new_meta(self, spec: InstanceSpec, pool: str = "") -> dict:
        """A new desktop's record, with the first free address of the subnet leased to it."""
        image = self._golden_image(spec.image_profile)
        digest = hashlib.sha256(spec.key.encode()).hexdigest()
        subnet = ipaddress.ip_network(self.config.subnet)
        with self.store.locked(NETWORK_LOCK):
            taken = {meta["ip"] for meta in self.store.all()}
            # The first address is the host's own end of the bridge.
            free = next((str(ip) for ip in list(subnet.hosts())[1:] if str(ip) not in taken), None)
            if free is None:
                raise DriverError(
                    f"No address is left on {subnet}: destroy a desktop first.", reason=NO_CAPACITY
                )
            meta = {
                "key": spec.key,
                "ip": free,
                # Pin the image build: the overlay's lower layer must never change under the desktop.
                "image": str(image.resolve()),
                "profile": spec.image_profile,
                # Interface names have at most 15 characters.
                "veth": f"{self.config.veth_prefix}{digest[: 15 - len(self.config.veth_prefix)]}",
                "hwaddr": "00:16:3e:" + ":".join(digest[i : i + 2] for i in (12, 14, 16)),
                **_policy_fields(spec.network_policy),
                **({"pool": pool} if pool else {}),
            }
            # Written under the lock, so the next allocation sees this address taken.
            self.store.write(spec.key, meta)
        return meta

    def _sync_network(self) -> None:
        """Re-render the project's firewall from every desktop's metadata, under the host-wide lock.

        Callers write their desktop's metadata first, so a render that began after this call holds it
        already: of ten provisions at once, those that waited while another rendered skip their own.
        """
        config = self.config
        asked = self.store.clock()
        with self.store.locked(NETWORK_LOCK):
            if self.store.network_synced_since(asked):
                return
            began = self.store.clock()
            desktops = [
                network.DesktopRules(
                    m["ip"],
                    m["veth"],
                    m["hwaddr"],
                    m["allow_internet"],
                    tuple(m["allowed_cidrs"]),
                    network.resolver_port(config.subnet, m["ip"], config.resolver_port_base),
                )
                for m in self.store.all()
            ]
            try:
                network.ensure_bridge(config.bridge, config.subnet)
                network.apply(
                    network.render_ruleset(
                        config.bridge,
                        config.subnet,
                        desktops,
                        config.host_tcp_ports,
                        config.nft_table,
                        config.veth_prefix,
                        config.denied_cidrs,
                        network.existing_dns_sets(config.nft_table),
                        config.host_limits,
                    )
                )
            except RuntimeError as exc:
                raise DriverError(f"could not set up the desktops' network: {exc}") from exc
            self.store.network_synced(began)

    def _ensure_resolver(self, meta: dict) -> None:
        config = self.config
        directory = self.store.dir(meta["key"])
        conf = resolver.render_conf(
            listen=network.gateway_of(config.subnet),
            port=network.resolver_port(config.subnet, meta["ip"], config.resolver_port_base),
            upstreams=config.upstream_dns,
            allow_internet=meta["allow_internet"],
            domains=tuple(meta.get("allowed_domains", ())),
            nftset=f"inet#{config.nft_table}_dns#{network.allowed_set(meta['veth'])}",
            pid_file=directory / resolver.PID,
            log_file=directory / resolver.LOG,
        )
        resolver.ensure(directory, conf)


def _policy_fields(policy: NetworkPolicy) -> dict:
    """What the desktop's record keeps of its egress policy, checked: networks and names only."""
    cidrs, domains = [], []
    for cidr in policy.allowed_cidrs:
        try:
            cidrs.append(str(ipaddress.IPv4Network(cidr, strict=False)))
        except ValueError as exc:
            raise DriverError(f"allowed CIDR {cidr!r} is not an IPv4 network: {exc}") from exc
    for name in policy.allowed_domains:
        domain = name.strip().rstrip(".").lower()
        if not ALLOWED_DOMAIN.fullmatch(domain):
            raise DriverError(f"allowed domain {name!r} is not a domain name")
        domains.append(domain)
    return {"allow_internet": policy.allow_internet, "allowed_cidrs": cidrs, "allowed_domains": domains}
