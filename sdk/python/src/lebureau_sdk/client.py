"""The clients: `Client` answers at once, `AsyncClient` answers awaitables; both have the same resources."""

from __future__ import annotations

from typing import Any

import httpx

from lebureau_sdk import resources as r
from lebureau_sdk._core import Async, AsyncRunner, Runner, Settings, Sync, SyncRunner
from lebureau_sdk.config import resolve


class _Resources:
    desktops: r.Desktops[Any]
    chat: r.Chat[Any]
    schedules: r.Schedules[Any]
    workspaces: r.Workspaces[Any]
    invitations: r.Invitations[Any]
    keys: r.Keys[Any]
    llm_keys: r.LLMKeys[Any]
    plans: r.Plans[Any]
    tiers: r.Tiers[Any]
    audit: r.Audit[Any]
    approvals: r.Approvals[Any]
    alerts: r.Alerts[Any]

    def _attach(self, runner: Runner) -> None:
        self.desktops = r.Desktops(runner)
        self.chat = r.Chat(runner)
        self.schedules = r.Schedules(runner)
        self.workspaces = r.Workspaces(runner)
        self.invitations = r.Invitations(runner)
        self.keys = r.Keys(runner)
        self.llm_keys = r.LLMKeys(runner)
        self.plans = r.Plans(runner)
        self.tiers = r.Tiers(runner)
        self.audit = r.Audit(runner)
        self.approvals = r.Approvals(runner)
        self.alerts = r.Alerts(runner)


class Client(_Resources):
    """Le Bureau's API, blocking.

    `base_url` and `api_key` default to LEBUREAU_URL and LEBUREAU_API_KEY, then to what `lebureau login`
    saved. Answers of 429 and 503 are retried `max_retries` times with backoff; other errors raise
    `LeBureauError`s typed by the API's error code.
    """

    desktops: r.Desktops[Sync]
    chat: r.Chat[Sync]
    schedules: r.Schedules[Sync]
    workspaces: r.Workspaces[Sync]
    invitations: r.Invitations[Sync]
    keys: r.Keys[Sync]
    llm_keys: r.LLMKeys[Sync]
    plans: r.Plans[Sync]
    tiers: r.Tiers[Sync]
    audit: r.Audit[Sync]
    approvals: r.Approvals[Sync]
    alerts: r.Alerts[Sync]

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 4,
        transport: httpx.BaseTransport | None = None,
    ):
        settings = Settings(*resolve(base_url, api_key), timeout=timeout, max_retries=max_retries)
        self._runner = SyncRunner(settings, transport)
        self._attach(self._runner)

    def close(self) -> None:
        self._runner.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient(_Resources):
    """Le Bureau's API for asyncio (and trio): the same resources and methods as `Client`, awaited;
    lists and streams are async iterators."""

    desktops: r.Desktops[Async]
    chat: r.Chat[Async]
    schedules: r.Schedules[Async]
    workspaces: r.Workspaces[Async]
    invitations: r.Invitations[Async]
    keys: r.Keys[Async]
    llm_keys: r.LLMKeys[Async]
    plans: r.Plans[Async]
    tiers: r.Tiers[Async]
    audit: r.Audit[Async]
    approvals: r.Approvals[Async]
    alerts: r.Alerts[Async]

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        max_retries: int = 4,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        settings = Settings(*resolve(base_url, api_key), timeout=timeout, max_retries=max_retries)
        self._runner = AsyncRunner(settings, transport)
        self._attach(self._runner)

    async def aclose(self) -> None:
        await self._runner.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()
