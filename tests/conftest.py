import os
import sys
import time
import uuid
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.conf import settings
from django.core.cache import cache
from django.test import override_settings
from rest_framework.test import APIClient

from desktops import services
from desktops.audit import Actor
from desktops.engines import engine
from desktops.models import Desktop, Role
from lebureau.celery import app as celery_app
from lebureau.settings import NOTIFY_TASKS, task_routes
from tests.factories import MembershipFactory, PlanFactory, UserFactory, WorkspaceFactory, api_key_for
from tests.support.desktops import wait_for_state
from tests.support.directory_driver import DirectoryDriver
from tests.support.internet import UPSTREAM, stand_in_internet, upstream_dns
from tests.support.scripted_model import ScriptedModelServer
from tests.support.services import free_port, patched_environ, port_open, service_process, workers_answering
from workers.drivers.lxc import network as lxc_net

TEST_DRIVER = "tests.support.directory_driver.DirectoryDriver"
# A Redis database of its own, so a developer's running worker never takes the suite's tasks.
TEST_BROKER = os.environ.get("TEST_CELERY_BROKER_URL", "redis://127.0.0.1:6379/14")
TEST_QUEUE = f"test-{uuid.uuid4().hex[:8]}"
# Agent turns are followed on a queue of their own, by workers of their own (see CELERY_CHAT_QUEUE).
TEST_CHAT_QUEUE = f"{TEST_QUEUE}-chat"
TEST_NOTIFY_QUEUE = f"{TEST_QUEUE}-notify"
LIFECYCLE_NODE, CHAT_NODE = f"lifecycle-{TEST_QUEUE}", f"chat-{TEST_QUEUE}"
ROOT = Path(__file__).resolve().parent.parent
# Desktops made through the API in tests get an LXC network and state of their own, apart from the
# driver suite's and from a control plane running on this host.
LXC_IMAGE = Path("/var/lib/lebureau/images/minimal/current/image.json")
# The marks of a module whose tests make real LXC desktops through the API and its worker.
LXC_DESKTOP_TESTS = [
    pytest.mark.lxc,
    pytest.mark.worker,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not LXC_IMAGE.is_file(), reason="the minimal golden image is not built (make setup builds it)"
    ),
]
# Where the scripted model server listens, on the test bridge's host address.
SCRIPTED_MODEL_PORT = 18431
FULL_IMAGE = Path("/var/lib/lebureau/images/full/current/image.json")
LXC_TEST_SETTINGS = {
    "LXC_STATE_DIR": "/var/lib/lebureau/test-api/desktops",
    "LXC_PATH": "/var/lib/lebureau/test-api/lxc",
    "LXC_BRIDGE": "lbapi0",
    "LXC_SUBNET": "10.215.0.0/24",
    "LXC_NFT_TABLE": "lebureau_api",
    "LXC_VETH_PREFIX": "lba",
    # The desktops' resolvers ask the suite's stand-in for the internet (the `internet` fixture).
    "LXC_UPSTREAM_DNS": UPSTREAM,
    # Every test desktop is booted for its test (the pool has tests of its own).
    "LXC_WARM_POOL": "",
}

SCRIPTED_MODEL_HOST = lxc_net.gateway_of(LXC_TEST_SETTINGS["LXC_SUBNET"])
SCRIPTED_MODEL_URL = f"http://{SCRIPTED_MODEL_HOST}:{SCRIPTED_MODEL_PORT}/v1"
# The guest endpoint the test desktops are given, on the test bridge's host address too.
GUEST_PORT = 18432
GUEST_URL = f"http://{SCRIPTED_MODEL_HOST}:{GUEST_PORT}"
# Where tests serve pages for the desktops' agents to browse, on the test bridge's host address too.
BRIDGE_PAGE_PORT = 18433


def pytest_configure(config):
    """Every task this process sends goes to the suite's broker and queues, from the first test on:
    the app keeps the connection pool of the first broker it used, whichever test used it first."""
    celery_app.conf.broker_url = TEST_BROKER
    celery_app.conf.task_default_queue = TEST_QUEUE
    celery_app.conf.task_routes = task_routes(TEST_CHAT_QUEUE, TEST_NOTIFY_QUEUE)


@pytest.fixture
def scripted_model(lxc_test_engine):
    """The stand-in for an LLM, on the desktops' bridge (brought up now rather than with a first desktop)."""
    lxc_net.ensure_bridge(LXC_TEST_SETTINGS["LXC_BRIDGE"], LXC_TEST_SETTINGS["LXC_SUBNET"])
    with ScriptedModelServer(SCRIPTED_MODEL_HOST, SCRIPTED_MODEL_PORT) as server:
        yield server.model


@pytest.fixture
def internet(tmp_path, upstream):
    """The suite's stand-in for the internet (``tests.support.internet``), for desktops to reach or not."""
    with stand_in_internet(tmp_path):
        yield


@pytest.fixture(scope="session")
def upstream(tmp_path_factory):
    """Where the test desktops' resolvers forward, for the whole session: they make desktops throughout."""
    with upstream_dns(tmp_path_factory.mktemp("upstream-dns")):
        yield


@pytest.fixture(scope="session")
def driver_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("driver")
    os.environ["TEST_DRIVER_DIR"] = str(path)
    return path


@pytest.fixture(scope="session", autouse=True)
def _control_plane_key(tmp_path_factory):
    """The suite's own control-plane SSH key, shared by the test process and its servers."""
    with override_settings(CONTROL_PLANE_SSH_KEY=tmp_path_factory.getbasetemp() / "ssh" / "id_ed25519"):
        yield


@pytest.fixture(scope="session", autouse=True)
def _rates_counted_afresh():
    """Rate limits and long-call slots live in the shared cache, counted per user id: an earlier run's
    user 1 is not this run's."""
    cache.clear()


@pytest.fixture(autouse=True)
def _test_driver(settings, driver_dir):
    settings.COMPUTE_DRIVER = TEST_DRIVER
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed, not security
    engine.cache_clear()
    yield
    engine.cache_clear()


@pytest.fixture(autouse=True)
def _audit_head_log(settings, tmp_path):
    """Each test's audit chain starts afresh: so does the log its head is exported to."""
    settings.AUDIT_HEAD_LOG = str(tmp_path / "audit-head.jsonl")


@pytest.fixture
def driver(driver_dir) -> DirectoryDriver:
    return engine(TEST_DRIVER)


@pytest.fixture
def plan(db):
    return PlanFactory()


@pytest.fixture
def workspace(db):
    return WorkspaceFactory()


@pytest.fixture
def members(workspace):
    """One member of each role in `workspace`, plus an outsider with a workspace of their own."""
    by_role = {role: MembershipFactory(workspace=workspace, role=role) for role in Role}
    by_role["outsider"] = MembershipFactory(role=Role.OWNER)
    return by_role


def client_for(membership=None, *, key: str | None = None) -> APIClient:
    client = APIClient()
    if key is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    elif membership is not None:
        client.force_login(membership.user)
    return client


@pytest.fixture
def owner_key(members):
    return api_key_for(members[Role.OWNER])


@pytest.fixture
def user(db):
    return UserFactory()


def service_env(driver_dir: Path, basetemp: Path, **extra: str) -> dict[str, str]:
    """Environment of the suite's own worker and web processes: the test database, broker and driver."""
    db = settings.DATABASES["default"]
    return {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "DATABASE_CONN_MAX_AGE": "0",
        "CELERY_BROKER_URL": TEST_BROKER,
        "CELERY_QUEUE": TEST_QUEUE,
        "CELERY_CHAT_QUEUE": TEST_CHAT_QUEUE,
        "CELERY_NOTIFY_QUEUE": TEST_NOTIFY_QUEUE,
        "COMPUTE_DRIVER": TEST_DRIVER,
        "TEST_DRIVER_DIR": str(driver_dir),
        "CONTROL_PLANE_SSH_KEY": str(settings.CONTROL_PLANE_SSH_KEY),
        **LXC_TEST_SETTINGS,
        **extra,
    }


@pytest.fixture(scope="session")
def celery_worker(django_db_setup, close_stray_connections, driver_dir, tmp_path_factory):
    """Real Celery workers on the test database, Redis and the directory test driver: one for the
    lifecycle (two slots, as a small deployment has) and one following agent turns (threads)."""
    basetemp = tmp_path_factory.getbasetemp()
    env = service_env(
        driver_dir,
        basetemp,
        DRIVER_RETRY_MAX="2",
        DRIVER_RETRY_BACKOFF_MAX="1",
        # Desktops may reach the scripted model server, the guest endpoint and the suite's pages on the
        # host, and a dead worker's chat turn is handed on after 3 s rather than a minute.
        LXC_HOST_TCP_PORTS=f"{SCRIPTED_MODEL_PORT},{GUEST_PORT},{BRIDGE_PAGE_PORT}",
        GUEST_URL=GUEST_URL,
        # The suite's webhook receivers listen on loopback.
        WEBHOOK_ALLOWED_NETWORKS="127.0.0.1/32",
        CHAT_STALE_AFTER="3",
    )
    worker = [sys.executable, "-m", "celery", "-A", "lebureau", "worker", "-l", "INFO"]
    # Node names of this run only: other test runs on the machine share the broker's control channel.
    lifecycle = [*worker, "-Q", TEST_QUEUE, "-c", "2", "-n", f"{LIFECYCLE_NODE}@%h"]
    # Chat and notifications on one thread-pool worker (the Procfile gives each its own): both wait on
    # the network, and the suite saves a process.
    queues = f"{TEST_CHAT_QUEUE},{TEST_NOTIFY_QUEUE}"
    chat = [*worker, "-Q", queues, "--pool", "threads", "-c", "8", "-n", f"{CHAT_NODE}@%h"]
    with (
        service_process("celery-worker", lifecycle, env, basetemp, lambda: node_answers(LIFECYCLE_NODE)),
        service_process("celery-chat", chat, env, basetemp, lambda: node_answers(CHAT_NODE)),
    ):
        yield


def node_answers(node: str) -> bool:
    return workers_answering(celery_app, f"{node}@")


def _task_name(task: dict) -> str:
    # Scheduled tasks (a countdown) come wrapped in their request.
    return task.get("name") or task.get("request", {}).get("name", "")


def wait_for_idle_lifecycle_worker(timeout: float = 60) -> None:
    """Until the suite's lifecycle worker has nothing under way, queued or due later (retries), nor the
    chat worker any notification: what a test set off must not be writing while the next test's
    database is being emptied."""
    deadline = time.monotonic() + timeout
    while True:
        inspect = celery_app.control.inspect(destination=None, timeout=0.5)
        work = [
            task
            for found in (inspect.active(), inspect.reserved(), inspect.scheduled())
            for node, tasks in (found or {}).items()
            for task in tasks
            if node.startswith(f"{LIFECYCLE_NODE}@")
            or (node.startswith(f"{CHAT_NODE}@") and _task_name(task) in NOTIFY_TASKS)
        ]
        if not work:
            return
        assert time.monotonic() < deadline, f"the lifecycle worker is still busy: {work}"
        time.sleep(0.2)


@contextmanager
def web_server(
    driver_dir: Path, basetemp: Path, host: str = "127.0.0.1", port: int | None = None, **extra: str
):
    """Daphne serving the whole ASGI app (pages, API, relays) on a port of loopback by default (a free
    one unless given: a test restarting the server gives the same one); yields its URL."""
    port = port or free_port()
    args = [sys.executable, "-m", "lebureau.server", "-b", host, "-p", str(port), "lebureau.asgi:application"]
    env = service_env(driver_dir, basetemp, **extra)
    with service_process(f"daphne-{port}", args, env, basetemp, lambda: port_open(port, host)):
        yield f"http://{host}:{port}"


@contextmanager
def guest_server(
    driver_dir: Path,
    basetemp: Path,
    host: str = "127.0.0.1",
    port: int | None = None,
    ready=None,
    **extra: str,
):
    """Daphne serving the guest endpoint (`lebureau.guest_asgi`), as `make run` does; yields its URL once
    `ready()` (by default: once its port answers)."""
    port = port or free_port()
    app = "lebureau.guest_asgi:application"
    args = [sys.executable, "-m", "lebureau.server", "--freebind", "-b", host, "-p", str(port), app]
    env = service_env(driver_dir, basetemp, ALLOWED_HOSTS=host, **extra)
    with service_process(f"guest-{port}", args, env, basetemp, ready or (lambda: port_open(port, host))):
        yield f"http://{host}:{port}"


@pytest.fixture
def guest_endpoint(lxc_test_engine, driver_dir, tmp_path_factory):
    """The guest endpoint where the test desktops are told it is, on their bridge."""
    lxc_net.ensure_bridge(LXC_TEST_SETTINGS["LXC_BRIDGE"], LXC_TEST_SETTINGS["LXC_SUBNET"])
    with guest_server(driver_dir, tmp_path_factory.getbasetemp(), SCRIPTED_MODEL_HOST, GUEST_PORT) as url:
        yield url


@pytest.fixture(scope="session")
def lxc_test_engine(django_db_setup, django_db_blocker, upstream):
    """The API tests' LXC engine, cleared of what an interrupted earlier run left behind."""
    from workers.drivers.lxc import LxcConfig, LxcDriver

    with patched_environ(LXC_TEST_SETTINGS), django_db_blocker.unblock():
        driver = LxcDriver(LxcConfig.from_env())
        leftovers = {i.key for i in driver.list_instances()}
        leftovers |= {path.parent.name for path in driver.config.state_dir.glob("*/meta.json")}
        for key in leftovers:
            driver.destroy(key)
    return driver


@pytest.fixture
def lxc_api(celery_worker, lxc_test_engine, members, plan, settings, monkeypatch):
    """A member's API client whose new desktops are real LXC desktops; destroys them afterwards."""
    settings.COMPUTE_DRIVER = "lxc"
    for name, value in LXC_TEST_SETTINGS.items():
        monkeypatch.setenv(name, value)
    engine.cache_clear()
    yield client_for(key=api_key_for(members[Role.MEMBER]))
    # Whoever made them (pages included), support staff clear them all.
    support = Actor(user=UserFactory(is_staff=True), support=True)
    for desktop in Desktop.objects.exclude(state__in=["destroyed", "destroying"]):
        services.desktop_act(actor=support, desktop=desktop, action="destroy")
    for desktop in Desktop.objects.exclude(state="destroyed"):
        wait_for_state(desktop.id, "destroyed", "error", timeout=60)
    # What the destroys set off after their last state (their notifications) must not be writing while
    # the next test's database is being emptied.
    wait_for_idle_lifecycle_worker()


@pytest.fixture(scope="session")
def close_stray_connections(django_db_setup, django_db_blocker):
    """Relay threads keep their own database connections; end them so the test database can be dropped."""
    yield
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


@pytest.fixture
def sim():
    """A running PVE simulator (tests/pve), stopped after the test."""
    from tests.pve.support import simulator

    sim = simulator()
    yield sim
    sim.stop()
