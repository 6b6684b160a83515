"""One member's long calls cannot take the web server's threads or database connections from everyone.

The real daphne, with a pool of only three database connections (the Procfile's has twenty), serves a
desktop whose shell is OpenSSH on loopback. A member starts eight commands of several seconds at once:
four run (LONG_CALLS_PER_PERSON), the others are answered 429 with Retry-After at once; while the four
run, holding no connection, another tenant's calls answer at their usual speed rather than waiting
for a connection the commands would hold.
"""

import statistics
import threading
import time

import pytest
import requests
from django.conf import settings

from billing.models import Subscription
from desktops.guest import control_plane_public_key
from desktops.models import Role
from tests.conftest import web_server
from tests.factories import DesktopFactory, TierFactory, api_key_for
from tests.support.services import sshd

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

POOL = 3
SECONDS = 6


@pytest.fixture(scope="module")
def site(celery_worker, driver_dir, tmp_path_factory):
    with sshd(tmp_path_factory.mktemp("sshd"), control_plane_public_key()) as port:
        extra = {
            "DESKTOP_SSH_PORT": str(port),
            "DESKTOP_SSH_USER": "root",
            "DATABASE_POOL_MAX": str(POOL),
            "DATABASE_POOL_TIMEOUT": "5",
        }
        with web_server(driver_dir, tmp_path_factory.getbasetemp(), **extra) as url:
            yield url


def test_a_members_long_commands_are_capped_and_hold_no_database_connection(site, members, workspace, plan):
    Subscription.objects.update_or_create(workspace=workspace, defaults={"tier": TierFactory()})
    shell = DesktopFactory(workspace=workspace, plan=plan, name="shell", private_ip="127.0.0.1")
    member = {"Authorization": f"Bearer {api_key_for(members[Role.MEMBER])}"}
    other = {"Authorization": f"Bearer {api_key_for(members['outsider'])}"}
    answers, timings = [], []

    def command():
        body = {"command": f"sleep {SECONDS}; echo done", "timeout": 60}
        answers.append(
            requests.post(f"{site}/api/desktops/{shell.id}/exec", json=body, headers=member, timeout=90)
        )

    commands = [threading.Thread(target=command) for _ in range(8)]
    for thread in commands:
        thread.start()
    time.sleep(1.5)  # the four are running now
    while any(thread.is_alive() for thread in commands):
        started = time.monotonic()
        listed = requests.get(f"{site}/api/desktops", headers=other, timeout=30)
        timings.append(time.monotonic() - started)
        assert listed.status_code == 200, listed.content
        time.sleep(0.1)
    for thread in commands:
        thread.join()

    ran = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code == 429]
    assert len(ran) == settings.LONG_CALLS_PER_PERSON and len(refused) == 8 - len(ran), [
        a.status_code for a in answers
    ]
    assert all(a.json()["stdout"] == "done\n" for a in ran)
    for answer in refused:
        assert answer.json()["error"]["code"] == "throttled"
        assert 1 <= int(answer.headers["Retry-After"]) <= 30
    p95 = statistics.quantiles(timings, n=20)[-1]
    print(f"the other tenant's p95 while four commands ran: {p95 * 1000:.0f} ms over {len(timings)} calls")
    assert p95 < 0.5, f"the other tenant waited {p95 * 1000:.0f} ms (p95): a connection was held"
    # Ended, the slots are free again.
    again = requests.post(
        f"{site}/api/desktops/{shell.id}/exec", json={"command": "true"}, headers=member, timeout=30
    )
    assert again.status_code == 200, again.content
