import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from desktops.models import Role
from lebureau.celery import app as celery_app
from tests.factories import MembershipFactory, PlanFactory, UserFactory, WorkspaceFactory, api_key_for
from tests.support.directory_driver import DirectoryDriver
from workers.drivers import get_driver

TEST_DRIVER = "tests.support.directory_driver.DirectoryDriver"
# A Redis database of its own, so a developer's running worker never takes the suite's tasks.
TEST_BROKER = os.environ.get("TEST_CELERY_BROKER_URL", "redis://127.0.0.1:6379/14")
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def driver_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("driver")
    os.environ["TEST_DRIVER_DIR"] = str(path)
    return path


@pytest.fixture(autouse=True)
def _test_driver(settings, driver_dir, tmp_path_factory):
    settings.COMPUTE_DRIVER = TEST_DRIVER
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # speed, not security
    settings.CONTROL_PLANE_SSH_KEY = tmp_path_factory.getbasetemp() / "ssh" / "id_ed25519"
    get_driver.cache_clear()
    yield
    get_driver.cache_clear()


@pytest.fixture
def driver(driver_dir) -> DirectoryDriver:
    return get_driver(TEST_DRIVER)


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


@pytest.fixture(scope="session")
def celery_worker(django_db_setup, django_db_blocker, driver_dir, tmp_path_factory):
    """A real Celery worker process on the test database, Redis and the directory test driver."""
    queue = f"test-{uuid.uuid4().hex[:8]}"
    celery_app.conf.broker_url = TEST_BROKER
    celery_app.conf.task_default_queue = queue
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CELERY_BROKER_URL": TEST_BROKER,
        "CELERY_QUEUE": queue,
        "COMPUTE_DRIVER": TEST_DRIVER,
        "TEST_DRIVER_DIR": str(driver_dir),
        "CONTROL_PLANE_SSH_KEY": str(tmp_path_factory.getbasetemp() / "ssh" / "id_ed25519"),
        "DRIVER_RETRY_MAX": "2",
        "DRIVER_RETRY_BACKOFF_MAX": "1",
        "DATABASE_CONN_MAX_AGE": "0",
    }
    log = open(tmp_path_factory.getbasetemp() / "celery-worker.log", "w")  # noqa: SIM115 (lives with the worker)
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "lebureau", "worker", "-Q", queue, "-c", "2", "-l", "INFO"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 60
    while not celery_app.control.ping(timeout=0.5, destination=None):
        if worker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"The Celery worker did not start; see {log.name}")
    yield worker
    worker.terminate()
    worker.wait(timeout=30)
    log.close()


@pytest.fixture(scope="session", autouse=True)
def _close_stray_connections(django_db_setup, django_db_blocker):
    """Relay threads keep their own database connections; end them so the test database can be dropped."""
    yield
    from django.db import connection

    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
