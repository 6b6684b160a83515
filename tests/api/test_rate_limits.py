"""Rate limits: the costly calls are counted per person, all their keys and sessions together (more keys
buy no more), per desktop on the guest endpoint; past the rate the answer is a 429 with Retry-After, and
nobody else is slowed. Counted in the shared Redis cache, as every web process counts.

The rates here are a handful a minute, so that the test reaches them in a few calls; each call is
refused for its own reason (a stopped desktop, a bad body) after being counted, so nothing runs.
"""

import pytest

from desktops.api.throttling import ActorRateThrottle
from desktops.models import Role
from tests.conftest import client_for
from tests.factories import DesktopFactory, api_key_for

pytestmark = pytest.mark.django_db

RATE = 3


@pytest.fixture
def low_rates(monkeypatch):
    rates = dict.fromkeys(ActorRateThrottle.THROTTLE_RATES, f"{RATE}/min")
    monkeypatch.setattr(ActorRateThrottle, "THROTTLE_RATES", rates)


def calls(desktop, workspace):
    return {
        "exec": ("post", f"/api/desktops/{desktop.id}/exec", {"command": "true"}),
        "actions": ("post", f"/api/desktops/{desktop.id}/actions", {"actions": []}),
        "screenshot": ("get", f"/api/desktops/{desktop.id}/screenshot", None),
        "chat": ("post", f"/api/desktops/{desktop.id}/chat", {"message": ""}),
        "relay": ("post", f"/api/desktops/{desktop.id}/sessions", {"mode": "nonsense"}),
        "invitations": ("post", f"/api/workspaces/{workspace.id}/invitations", {"email": "not an address"}),
    }


@pytest.mark.parametrize("scope", ["exec", "actions", "screenshot", "chat", "relay", "invitations"])
def test_a_person_past_the_rate_gets_429_whichever_key_they_use_and_others_go_on(
    low_rates, members, workspace, plan, scope
):
    desktop = DesktopFactory(workspace=workspace, plan=plan, state="stopped")
    method, path, body = calls(desktop, workspace)[scope]
    person = members[Role.OWNER]
    keys = [client_for(key=api_key_for(person)) for _ in range(2)] + [client_for(person)]
    answers = [getattr(keys[i % 3], method)(path, body, format="json") for i in range(RATE)]
    assert all(a.status_code in (400, 409, 503) for a in answers), [a.status_code for a in answers]
    # A fresh key of the same person is no way round it, nor is the browser session.
    for client in (client_for(key=api_key_for(person)), client_for(person)):
        refused = getattr(client, method)(path, body, format="json")
        assert refused.status_code == 429, refused.content
        assert refused.json()["error"]["code"] == "throttled"
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
    # Another person of the workspace has their own count.
    admin = client_for(key=api_key_for(members[Role.ADMIN]))
    assert getattr(admin, method)(path, body, format="json").status_code != 429


def test_reads_of_a_limited_endpoint_are_not_counted(low_rates, members, workspace, plan):
    desktop = DesktopFactory(workspace=workspace, plan=plan)
    client = client_for(key=api_key_for(members[Role.MEMBER]))
    for _ in range(RATE * 2):
        assert client.get(f"/api/desktops/{desktop.id}/chat").status_code == 200
