"""An agent's failed turn, in words: the runtime's raw errors (as the real OpenClaw writes them) read as
what happened, with the fix one click away, in the reader's language."""

import pytest

from desktops.agent_failures import failure_of
from desktops.models import ChatMessage, Role
from tests.conftest import client_for
from tests.factories import DesktopFactory

NO_KEY = (
    'The agent stopped with status 1: The agent failed: {"message": "No route-compatible authentication '
    'source is configured for openai.", "type": "authentication_error"}'
)
BAD_KEY = (
    'The agent stopped with status 1: The agent failed: {"message": "401 Incorrect API key provided.", '
    '"type": "authentication_error"}'
)


@pytest.mark.parametrize(
    ("raw", "kind", "words", "fix"),
    [
        (NO_KEY, "llm_key_missing", "No LLM key for OpenAI in this workspace", "settings"),
        (BAD_KEY, "llm_key_rejected", "refused this workspace's LLM key", "settings"),
        (
            'The agent stopped with status 1: The agent failed: {"message": "upstream provider timeout"}',
            "provider_unreachable",
            "could not be reached",
            "",
        ),
        (
            "This desktop has no agent runtime: OpenClaw is not installed in this desktop.",
            "no_runtime",
            "no agent runtime",
            "settings",
        ),
        ("The agent stopped with status 3: segfault", "agent_failed", "stopped without an answer", ""),
    ],
)
def test_raw_errors_read_as_words(raw, kind, words, fix):
    failure = failure_of(raw)
    assert (failure.kind, failure.fix) == (kind, fix)
    assert words in failure.message and "{" not in failure.message


def test_the_conversation_says_why_a_turn_failed_and_where_to_fix_it(members, workspace, plan):
    desktop = DesktopFactory(workspace=workspace)
    asked = ChatMessage.objects.create(desktop=desktop, author="operator", content="Range le bureau")
    ChatMessage.objects.create(
        desktop=desktop, author="agent", reply_to=asked, status="error", content=BAD_KEY
    )
    api = client_for(members[Role.VIEWER])
    reply = api.get(f"/api/desktops/{desktop.id}/chat").json()["results"][-1]
    assert reply["content"] == BAD_KEY  # the detail stays
    assert reply["failure"]["kind"] == "llm_key_rejected"
    assert reply["failure"]["fixUrl"] == f"/w/{workspace.id}/settings/"
    french = api.get(f"/api/desktops/{desktop.id}/chat", HTTP_ACCEPT_LANGUAGE="fr").json()["results"][-1]
    assert "a refusé la clé LLM" in french["failure"]["message"]
    assert api.get(f"/api/desktops/{desktop.id}/chat").json()["results"][0]["failure"] is None
