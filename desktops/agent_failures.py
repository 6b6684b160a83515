"""Why an agent's turn failed, in words: the agent runtime's raw errors (OpenClaw's JSON, the bridge's
exit statuses) read as what happened and where to fix it.

The raw text stays in the reply's content, for whoever needs the detail; this reads it again each
time it is shown, in the reader's language.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.utils.translation import gettext as _

from desktops.models import ChatMessage, LLMProvider


@dataclass(frozen=True)
class AgentFailure:
    kind: str
    message: str
    # Where to put it right: "settings" (the workspace's), or "" when nothing on our pages can.
    fix: str
    # The raw error, where it tells more than the message (the provider's or the runtime's own words).
    detail: str = ""


# The raw error of a turn that was never started, its workspace having no key (`chat_send`).
NO_LLM_KEY = "The workspace has no LLM key: the turn was not started."
# (kind, pattern over the raw error): the first that matches says what happened.
PATTERNS = [
    ("llm_key_missing", re.compile(re.escape(NO_LLM_KEY))),
    (
        "llm_key_missing",
        re.compile(r"No route-compatible authentication source is configured for (?P<p>[\w-]+)"),
    ),
    ("llm_key_missing", re.compile(r"No API key found for provider \"?(?P<p>[\w-]+)", re.I)),
    (
        "llm_key_rejected",
        re.compile(
            r"\b401\b|\b403\b|incorrect api key|invalid[ _]api[ _]key|authentication_error|unauthori[sz]ed",
            re.I,
        ),
    ),
    ("provider_limited", re.compile(r"\b429\b|rate[ _]limit|insufficient_quota|quota exceeded", re.I)),
    (
        "provider_unreachable",
        re.compile(
            r"upstream provider timeout|ECONNREFUSED|ENOTFOUND|EAI_AGAIN|ETIMEDOUT|fetch failed", re.I
        ),
    ),
    ("no_runtime", re.compile(r"has no agent runtime")),
    ("desktop_not_running", re.compile(r"^The desktop is \w+: start it")),
]
# OpenClaw names a provider by its id: a well-known one's, or one of our keys' (agent_config.provider_id).
PROVIDER_NAMES = {
    LLMProvider.OPENAI: "OpenAI",
    LLMProvider.ANTHROPIC: "Anthropic",
    LLMProvider.OPENROUTER: "OpenRouter",
}
FIXED_IN_SETTINGS = {"llm_key_missing", "llm_key_rejected", "provider_limited", "no_runtime"}
# Where the message says all there is (the rest is the platform's own words, in English).
SAID_IN_FULL = {"llm_key_missing", "no_runtime", "desktop_not_running"}


def _message(kind: str, provider: str) -> str:
    named = {"provider": PROVIDER_NAMES.get(provider, provider) or _("the model's provider")}
    return {
        "llm_key_missing": _("No LLM key for %(provider)s in this workspace: add one in Settings.") % named,
        "llm_key_rejected": _(
            "The model's provider refused this workspace's LLM key (wrong, revoked or expired): "
            "check it in Settings."
        ),
        "provider_limited": _(
            "The model's provider refused for now: rate limit or credit exhausted on this workspace's key."
        ),
        "provider_unreachable": _(
            "The model's provider could not be reached from the desktop: check its address and the "
            "desktop's network access."
        ),
        "no_runtime": _(
            "This desktop has no agent runtime (minimal image): use the full image, or change the agent "
            "command in Settings."
        ),
        "desktop_not_running": _("The desktop was not running: start it, then send the message again."),
        "agent_failed": _("The agent stopped without an answer."),
    }[kind]


def agent_failure(message: ChatMessage) -> AgentFailure | None:
    """What went wrong with this reply, in words; None unless its turn failed."""
    return failure_of(message.content) if message.status == ChatMessage.Status.ERROR else None


def failure_of(raw: str) -> AgentFailure:
    """Read a failed turn's raw error."""
    kind, provider = "agent_failed", ""
    for candidate, pattern in PATTERNS:
        if found := pattern.search(raw):
            kind, provider = candidate, found.groupdict().get("p") or ""
            break
    fix = "settings" if kind in FIXED_IN_SETTINGS else ""
    return AgentFailure(kind, _message(kind, provider), fix, "" if kind in SAID_IN_FULL else raw)
