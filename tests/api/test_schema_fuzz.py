"""The API against its own OpenAPI schema: requests generated from /api/schema/, valid and not,
sent to the real Django app in this process with an owner's API key, on the test PostgreSQL.

Every operation must answer without a 5xx, with a status, content type, headers and body the schema
documents, and must refuse what the schema forbids. Not checked: that every request the schema
allows is accepted, because the API also refuses what no schema can say (an expiry in the past, a
plan or a member's e-mail that does not exist, an OpenAI-compatible key without its base URL).

The examples are the same on every run, so a failure reproduces and the suite does not fail on a
draw. The test's transaction is rolled back, never committed, so the work the lifecycle endpoints
hand to the queue on commit is never sent: no worker acts on the fuzzed desktops.
"""

import pytest
import schemathesis
from django.core import signals
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig

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
def owner_auth(db, owner_key):
    # As Django's test client does: a request must not close the connection holding the test's
    # transaction.
    for signal in (signals.request_started, signals.request_finished):
        signal.disconnect(close_old_connections)
    yield {"Authorization": f"Bearer {owner_key}"}
    for signal in (signals.request_started, signals.request_finished):
        signal.connect(close_old_connections)


@schema.parametrize()
# One owner and one transaction for all of an operation's examples.
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
def test_the_api_answers_as_its_schema_says(case, owner_auth):
    case.call_and_validate(headers=owner_auth)
