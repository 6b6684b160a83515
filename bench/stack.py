"""The control plane a bench runs against: its own daphne and Celery worker on the bench's own
database (`bench/database.py`), a throwaway user, workspace and API key, and an LXC network of its own.
Everything it made is removed afterwards, desktops included."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from bench.database import django_setup
from bench.procfile import procfile_command

django_setup()

from django.contrib.auth import get_user_model  # noqa: E402

from billing.models import Tier  # noqa: E402
from billing.services import subscription_set  # noqa: E402
from desktops import services  # noqa: E402
from desktops.audit import Actor  # noqa: E402
from desktops.models import Desktop, DesktopState  # noqa: E402
from lebureau.celery import app as celery_app  # noqa: E402
from lebureau.settings import task_routes  # noqa: E402
from tests.support.services import (  # noqa: E402
    free_port,
    patched_environ,
    port_open,
    service_process,
    workers_answering,
)
from workers.drivers.lxc import LxcConfig, LxcDriver, network  # noqa: E402

BENCH_LXC = {
    "COMPUTE_DRIVER": "lxc",
    "LXC_STATE_DIR": "/var/lib/lebureau/bench-api/desktops",
    "LXC_PATH": "/var/lib/lebureau/bench-api/lxc",
    "LXC_BRIDGE": "lbbench1",
    "LXC_SUBNET": "10.217.0.0/24",
    "LXC_NFT_TABLE": "lebureau_bench_api",
    "LXC_VETH_PREFIX": "lbp",
    # No desktop booted ahead of demand unless a bench asks for it: creates are timed from nothing.
    "LXC_WARM_POOL": "",
}
BROKER = "redis://127.0.0.1:6379/13"


@dataclass
class Stack:
    base: str
    key: str
    user: object
    workspace: object


@contextmanager
def control_plane(name: str, *, concurrency: int, env: dict[str, str] | None = None):
    """Run daphne + a worker for the bench `name`; yields a `Stack`."""
    if os.geteuid() != 0:
        sys.exit("run as root: the LXC engine mounts disks and starts containers")
    clear_leftovers()
    run = uuid.uuid4().hex[:8]
    queue = f"bench-{run}"
    user = get_user_model().objects.create_user(
        f"bench-{run}", f"bench-{run}@example.com", None, is_staff=True
    )
    workspace = services.workspace_create(user=user, name=f"{name} bench")
    # A bench makes more desktops at once than the free tier allows: it lifts its own tier, as support.
    support = Actor(user=user, support=True)
    subscription_set(actor=support, workspace_id=workspace.id, tier=Tier.objects.get(name="business"))
    actor = Actor(user=user)
    _, key = services.api_key_create(actor=actor, workspace_id=workspace.id, name="bench", scope="write")
    logs = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    port = free_port()
    chat_queue, notify_queue = f"{queue}-chat", f"{queue}-notify"
    env = {
        **os.environ,
        **BENCH_LXC,
        "CELERY_BROKER_URL": BROKER,
        "CELERY_QUEUE": queue,
        "CELERY_CHAT_QUEUE": chat_queue,
        "CELERY_NOTIFY_QUEUE": notify_queue,
        **(env or {}),
    }
    celery_app.conf.broker_url = BROKER
    celery_app.conf.task_default_queue = queue
    celery_app.conf.task_routes = task_routes(chat_queue, notify_queue)
    worker = [sys.executable, "-m", "celery", "-A", "lebureau", "worker", "-l", "INFO"]
    lifecycle = [*worker, "-Q", queue, "-c", str(concurrency), "-n", f"lifecycle-{run}@%h"]
    chat = [
        *worker,
        "-Q",
        f"{chat_queue},{notify_queue}",
        "--pool",
        "threads",
        "-c",
        "8",
        "-n",
        f"chat-{run}@%h",
    ]
    try:
        with (
            service_process(
                "worker", lifecycle, env, logs, lambda: workers_answering(celery_app, f"lifecycle-{run}@")
            ),
            service_process("chat", chat, env, logs, lambda: workers_answering(celery_app, f"chat-{run}@")),
            service_process(
                "web", procfile_command("web"), {**env, "PORT": str(port)}, logs, lambda: port_open(port)
            ),
        ):
            try:
                yield Stack(f"http://127.0.0.1:{port}", key, user, workspace)
            finally:
                clear_leftovers()
    finally:
        workspace.delete()
        user.delete()
        network.remove_tables(BENCH_LXC["LXC_NFT_TABLE"])
        subprocess.run(["ip", "link", "del", BENCH_LXC["LXC_BRIDGE"]], capture_output=True)


def bench_engine() -> LxcDriver:
    """The bench's LXC engine as its worker sees it (its warm pool aside)."""
    with patched_environ({name: v for name, v in BENCH_LXC.items() if name.startswith("LXC_")}):
        return LxcDriver(LxcConfig.from_env())


def clear_leftovers() -> None:
    """Desktops left on the bench's engine (by an interrupted run, or this one) would skew the figures."""
    driver = bench_engine()
    for key in {i.key for i in driver.list_instances()} | {
        p.parent.name for p in driver.config.state_dir.glob("*/meta.json")
    }:
        driver.destroy(key)
    # Their rows too: left in a step, they would count as another workspace's steps waiting for a
    # worker, and hold the next run's creates to the per-workspace cap (lifecycle.desktop_step_slot).
    Desktop.objects.filter(engine_instance=driver.instance_id).exclude(state=DesktopState.DESTROYED).update(
        state=DesktopState.DESTROYED, step_until=None, step_holder=""
    )
