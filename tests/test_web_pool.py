"""A burst of requests against a PostgreSQL that allows few connections: the web server, each request
in a thread of its own, used to open one connection per request and answer 500 past the limit; with
its pool (DATABASE_POOL_MAX, as the Procfile runs it) they wait their turn and all succeed."""

from concurrent.futures import ThreadPoolExecutor

import pytest
import requests
from django.conf import settings
from django.db import connection

from desktops.models import Role
from tests.conftest import web_server
from tests.factories import DesktopFactory, api_key_for

pytestmark = pytest.mark.django_db(transaction=True)

ROLE, LIMIT = "lebureau_pool_test", 4


@pytest.fixture
def few_connections():
    """A database role PostgreSQL lets open LIMIT connections at once; yields its DATABASE_URL."""
    with connection.cursor() as cursor:
        cursor.execute(f"DROP ROLE IF EXISTS {ROLE}")
        cursor.execute(f"CREATE ROLE {ROLE} LOGIN CONNECTION LIMIT {LIMIT}")
        cursor.execute(f"GRANT pg_read_all_data, pg_write_all_data TO {ROLE}")
    db = settings.DATABASES["default"]
    yield f"postgres://{ROLE}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [ROLE])
        cursor.execute(f"DROP ROLE {ROLE}")


def burst(url: str, key: str, count: int = 40) -> list[int]:
    def get(_):
        return requests.get(f"{url}/api/desktops", headers={"Authorization": f"Bearer {key}"}, timeout=60)

    with ThreadPoolExecutor(max_workers=count) as pool:
        return [response.status_code for response in pool.map(get, range(count))]


@pytest.mark.parametrize(("pool", "all_answered"), [("0", False), (str(LIMIT - 1), True)])
def test_a_burst_waits_for_the_pools_connections_instead_of_failing(
    members, plan, driver_dir, tmp_path, few_connections, pool, all_answered
):
    DesktopFactory.create_batch(3, workspace=members[Role.MEMBER].workspace)
    key = api_key_for(members[Role.MEMBER])
    with web_server(driver_dir, tmp_path, DATABASE_URL=few_connections, DATABASE_POOL_MAX=pool) as url:
        codes = burst(url, key)
    # Without the pool the same burst meets PostgreSQL's limit: the test shows the failure it prevents.
    assert (set(codes) == {200}) is all_answered, codes
