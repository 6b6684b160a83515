"""The LXC engine's warm pool: desktops booted ahead of demand, taken by creates of their shape."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import paramiko
import pytest

from desktops.guest import vnc_password
from tests.drivers.test_lxc_contract import TEST_CONFIG, _spec, remove_network, ssh
from tests.drivers.test_lxc_contract import pytestmark as lxc_marks
from tests.support.rfb import desktop_name, grab_framebuffer
from workers.drivers.base import ControlPlane, InstanceState, PoolShape
from workers.drivers.lxc import LxcDriver

pytestmark = lxc_marks

ROOT = Path("/var/lib/lebureau/test-pool")
SHAPE = PoolShape("minimal", 1, 512, 2, size=1)
CONFIG = dataclasses.replace(
    TEST_CONFIG,
    state_dir=ROOT / "desktops",
    lxc_path=ROOT / "lxc",
    lock_dir=ROOT / "locks",
    bridge="lbpool0",
    subnet="10.218.0.0/24",
    nft_table="lebureau_pool_test",
    veth_prefix="lbw",
    warm_pool=(SHAPE,),
)


@pytest.fixture(scope="module")
def control_key(tmp_path_factory) -> tuple[ControlPlane, paramiko.Ed25519Key]:
    path = tmp_path_factory.mktemp("control-plane") / "id_ed25519"
    control_plane = ControlPlane(ssh_key_path=path)
    control_plane.ssh_public_key  # noqa: B018 (makes the pair)
    return control_plane, paramiko.Ed25519Key.from_private_key_file(str(path))


@pytest.fixture
def pool(control_key, upstream):
    driver = LxcDriver(CONFIG, control_key[0])
    yield driver
    for meta in driver.store.all():
        driver.destroy(meta["key"])
    remove_network(CONFIG.bridge, CONFIG.nft_table)


def members(driver: LxcDriver) -> list[str]:
    return [m["key"] for m in driver.store.all() if m.get("pool")]


def test_a_create_takes_the_booted_desktop_and_becomes_it(pool, control_key):
    """The engine's periodic work boots the member; a create of its shape gets it, renamed and keyed as
    the desktop, while nothing lists the member as anyone's before."""
    assert pool.maintenance() == {"warm_pool": {SHAPE.tag: {"booted": 1}}}
    [member] = members(pool)
    assert pool.list_instances() == [], "a pool member is nobody's desktop: reconcile must not judge it"

    spec = _spec(control_key[1], ssh_public_key=pool.control_plane.ssh_public_key, hostname="pooled")
    status = pool.provision(spec)
    assert (status.key, status.state, status.ref) == (spec.key, InstanceState.RUNNING, spec.key)
    assert [i.key for i in pool.list_instances()] == [spec.key]
    assert pool.store.container(spec.key) == member and members(pool) == []
    who = "hostname; cat /etc/bureau/desktop_id /etc/bureau/token"
    code, out, _ = ssh(status.private_ip, control_key[1], who)
    assert (code, out.split()) == (0, ["pooled", spec.key, "bureau-test-token"])
    assert pool.usage(spec.key) is not None
    # Its screen opens with the desktop's own VNC password, written at the claim, and no other's.
    assert grab_framebuffer(status.private_ip, vnc_password(spec.key, "view"))[:2] == (1280, 800)
    assert desktop_name(status.private_ip, vnc_password(spec.key, "view")) == "pooled"
    with pytest.raises(AssertionError, match="security handshake failed"):
        grab_framebuffer(status.private_ip, vnc_password("dsk_another", "view"))

    # Stop, start and destroy reach the container it runs as.
    assert pool.stop(spec.key).state == InstanceState.STOPPED
    assert pool.start(spec.key).state == InstanceState.RUNNING
    code, out, _ = ssh(status.private_ip, control_key[1], "hostname")
    assert out.strip() == "pooled", "the name holds across a reboot too"
    pool.destroy(spec.key)
    assert pool.list_instances() == [] and not (CONFIG.lxc_path / member).exists()
    assert not (CONFIG.state_dir / spec.key).exists() and not (CONFIG.state_dir / member).exists()


def test_a_member_serves_one_desktop_and_the_next_gets_a_fresh_one(pool, control_key):
    """Two creates at once with one member: one takes it, the other boots its own; the refill boots a new
    member that shares nothing with the desktop that took the last one."""
    pool.maintenance()
    public = pool.control_plane.ssh_public_key
    specs = [_spec(control_key[1], ssh_public_key=public) for _ in range(2)]
    threads = [threading.Thread(target=pool.provision, args=(spec,)) for spec in specs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    containers = sorted(pool.store.container(spec.key) for spec in specs)
    assert len([c for c in containers if c.startswith("lbpool-")]) == 1, containers
    assert len({pool.status(spec.key).private_ip for spec in specs}) == 2

    assert pool.maintenance() == {"warm_pool": {SHAPE.tag: {"booted": 1}}}
    [fresh] = members(pool)
    assert fresh not in containers
    taken = next(spec for spec in specs if pool.store.container(spec.key).startswith("lbpool-"))
    machine_ids = {(pool.store.dir(key) / "rootfs/etc/machine-id").read_text() for key in (fresh, taken.key)}
    assert len(machine_ids) == 2


def test_other_shapes_boot_as_before_and_the_pool_follows_its_configuration(pool, control_key):
    pool.maintenance()
    [member] = members(pool)
    bigger = _spec(control_key[1], ssh_public_key=pool.control_plane.ssh_public_key, disk_gib=3)
    assert pool.provision(bigger).state == InstanceState.RUNNING
    assert pool.store.container(bigger.key) == bigger.key and members(pool) == [member]

    # A member that went down (the host rebooted) is replaced; a shape no longer wanted is removed.
    pool.lxc.stop(member, force=True)
    assert pool.maintenance() == {"warm_pool": {SHAPE.tag: {"removed": 1, "booted": 1}}}
    assert len(members(pool)) == 1 and members(pool) != [member]
    smaller = LxcDriver(dataclasses.replace(CONFIG, warm_pool=()), pool.control_plane)
    assert smaller.maintenance() == {"warm_pool": {SHAPE.tag: {"removed": 1}}}
    assert members(pool) == [] and [i.key for i in pool.list_instances()] == [bigger.key]


def test_a_shape_whose_image_is_not_built_leaves_nothing_behind(pool, caplog):
    missing = LxcDriver(
        dataclasses.replace(CONFIG, warm_pool=(PoolShape("nosuch", 1, 512, 2, 1),)), pool.control_plane
    )
    assert missing.maintenance() == {}
    assert pool.store.all() == [] and "warm pool lbp-nosuch" in caplog.text and "not built" in caplog.text
