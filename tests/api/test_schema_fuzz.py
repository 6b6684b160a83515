"""The API against its own OpenAPI schema: requests generated from /api/schema/, valid and not,
sent to the real Django app in this process with an owner's API key, on the test PostgreSQL; then
again with an outsider's key (a workspace of their own), each path aimed at the owner's things.

Every operation must answer without a 5xx, with a status, content type, headers and body the schema
documents, and must refuse what the schema forbids. Not checked: that every request the schema
allows is accepted, because the API also refuses what no schema can say (an expiry in the past, a
plan or a member's e-mail that does not exist, an OpenAI-compatible key without its base URL).

The examples are the same on every run, so a failure reproduces and the suite does not fail on a
draw. The test's transaction is rolled back, never committed, so the work the lifecycle endpoints
hand to the queue on commit is never sent: no worker acts on the fuzzed desktops.
"""

from decimal import Decimal

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

from billing.services import model_price_set
from desktops import schedules, services
from desktops.audit import Actor
from desktops.models import Role
from tests.factories import DesktopFactory, api_key_for

CONFIG = SchemathesisConfig.from_dict(
    {
        # About 45 s for the 31 operations on this 2-core machine.
        "generation": {"max-examples": 30, "deterministic": True, "database": "none"},
        "checks": {"positive_data_acceptance": {"enabled": False}},
    }
)
# Loaded when the module is collected: the schema's operations become the test's parameters.
schema = schemathesis.openapi.from_wsgi("/api/schema/", get_wsgi_application(), config=CONFIG)


@pytest.fixture
def in_transaction(db):
    # As Django's test client does: a request must not close the connection holding the test's
    # transaction.
    for signal in (signals.request_started, signals.request_finished):
        signal.disconnect(close_old_connections)
    yield
    for signal in (signals.request_started, signals.request_finished):
        signal.connect(close_old_connections)


@pytest.fixture
def owner_auth(in_transaction, owner_key):
    return {"Authorization": f"Bearer {owner_key}"}


# Names that appear in an answer only if the owner's things leaked to the outsider.
SECRET_NAME, SECRET_MESSAGE = "owners-private-desktop", "the owner's private instructions"


@pytest.fixture
def owners_things(in_transaction, members, plan):
    """One of each of the owner's things a path can name, by the path's prefix and parameter."""
    owner = members[Role.OWNER]
    actor, workspace = Actor(user=owner.user), owner.workspace
    desktop = DesktopFactory(workspace=workspace, name=SECRET_NAME)
    reply = services.chat_send(actor=actor, desktop=desktop, message=SECRET_MESSAGE)
    schedule = schedules.schedule_create(
        actor=actor, desktop=desktop, cron="0 9 * * 1", message=SECRET_MESSAGE
    )
    llm_key = services.llm_key_save(
        actor=actor, workspace_id=workspace.id, provider="anthropic", name="owners", secret="sk-owner-secret"
    )
    invitation = services.member_invite(
        actor=actor, workspace_id=workspace.id, email="invitee@example.com", role=Role.MEMBER
    )
    price = model_price_set(
        actor=actor,
        workspace_id=workspace.id,
        model="m",
        input_per_million=Decimal(1),
        output_per_million=Decimal(2),
    )
    api_key_for(owner)
    key = owner.user.api_keys.get()
    ids = {
        "/api/desktops/{id}": desktop.id,
        "/api/workspaces/{id}": workspace.id,
        "/api/llm-keys/{id}": llm_key.id,
        "/api/schedules/{id}": schedule.id,
        "/api/invitations/{id}": invitation.id,
        "/api/keys/{id}": key.id,
    }
    return ids, {
        "messageId": reply.id,
        "membershipId": str(owner.id),
        "invitationId": invitation.id,
        "priceId": str(price.id),
    }


def aimed_at(case, things) -> bool:
    """Point the case's path parameters at the owner's things; True if it names any."""
    by_prefix, by_name = things
    aimed = False
    for name in case.path_parameters or {}:
        if name == "id":
            owned = next((v for prefix, v in by_prefix.items() if case.path.startswith(prefix) and v), None)
        else:
            owned = by_name.get(name)
        if owned:
            case.path_parameters[name] = owned
            aimed = True
    return aimed


@schema.parametrize()
# One owner and one transaction for all of an operation's examples.
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
def test_the_api_answers_as_its_schema_says(case, owner_auth):
    case.call_and_validate(headers=owner_auth)


@schema.parametrize()
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
def test_an_outsider_reaches_none_of_the_owners_things(case, members, owners_things):
    """Every operation, with valid and invalid input, from another workspace's key: an answer the schema
    documents, never a 5xx, never a success on a path naming the owner's things, never their data."""
    outsider = {"Authorization": f"Bearer {api_key_for(members['outsider'])}"}
    aimed = aimed_at(case, owners_things)
    response = case.call_and_validate(headers=outsider)
    assert response.status_code < 500
    # OPTIONS describes the endpoint, the same for any id, and never reads the object.
    if aimed and case.method != "OPTIONS":
        answered = f"{case.method} {case.formatted_path} answered {response.status_code}"
        assert response.status_code >= 400, answered
    assert SECRET_NAME not in response.text and SECRET_MESSAGE not in response.text
    assert "sk-owner-secret" not in response.text
