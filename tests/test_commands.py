from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from desktops import crypto
from desktops.models import ApiKey, Role
from tests.conftest import client_for


def test_issue_api_key_gives_a_working_key(user, plan):
    out = StringIO()
    call_command("issue_api_key", user.email, stdout=out)
    token = out.getvalue().strip()
    assert (
        ApiKey.objects.get(prefix=crypto.api_token_prefix(token)).workspace.memberships.get().role
        == Role.OWNER
    )
    assert client_for(key=token).get("/api/plans").status_code == 200


def test_issue_api_key_for_an_unknown_user(db):
    with pytest.raises(CommandError, match="No user"):
        call_command("issue_api_key", "nobody@example.com")
