"""How every SDK method is made: written once, as a *plan*, run by either client.

A plan is a generator that yields steps (an HTTP `Call`, a `Sleep`, an `Emit` of one item to the caller)
and gets each step's result back; it never does I/O itself. `Client` runs plans with httpx's blocking
client, `AsyncClient` with its asyncio one, so the sync and async SDKs are one piece of code. Each
method names the API operation it stands for (an `Endpoint`), which is how the drift test finds it.
"""

from __future__ import annotations

import functools
import inspect
import random
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterator
from dataclasses import dataclass, field, fields, is_dataclass
from datetime import date, datetime
from decimal import Decimal
from importlib.metadata import version
from types import NoneType, UnionType
from typing import (
    Any,
    Concatenate,
    Generic,
    ParamSpec,
    Protocol,
    TypeVar,
    Union,
    cast,
    get_args,
    get_origin,
    get_type_hints,
    overload,
)
from urllib.parse import quote

import anyio
import httpx

from lebureau_sdk.errors import error_from

T = TypeVar("T")
P = ParamSpec("P")
M = TypeVar("M", bound="Mode")


def camel(name: str) -> str:
    """The API's spelling of a Python name: `image_profile` -> `imageProfile` (`all_` -> `all`)."""
    head, *rest = name.rstrip("_").split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


# Steps a plan yields


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    returns: Any = None  # a model (decoded), `bytes`, `Binary`, `dict` (raw JSON) or None (no body)
    content: bytes | None = None  # sent as the raw body instead of JSON (a file's bytes)


@dataclass(frozen=True)
class Binary:
    """An answer that is not JSON (an image): its bytes, their type, and the headers that describe them."""

    content: bytes
    content_type: str
    headers: dict[str, str]


@dataclass(frozen=True)
class Sleep:
    seconds: float


@dataclass(frozen=True)
class Emit(Generic[T]):
    value: T


Step = Call | Sleep | Emit[Any]
Plan = Generator[Step, Any, T]
# A plan whose items, of type T, are what the caller iterates over.
Stream = Generator[Call | Sleep | Emit[T], Any, None]


# The API's operations


ENDPOINTS: list[Endpoint] = []
PAGING = ("page", "pageSize")


@dataclass(frozen=True)
class Endpoint:
    """One operation of the REST API, as the SDK calls it.

    `query` and `body` name the SDK's parameters; `"labels:label"` sends the parameter `labels` as the
    wire's `label` (otherwise a name is camelCased). A `paged` endpoint answers pages of `returns`.
    """

    method: str
    path: str
    returns: Any = None
    query: tuple[str, ...] = ()
    body: tuple[str, ...] = ()
    paged: bool = False

    def __post_init__(self):
        ENDPOINTS.append(self)

    @property
    def path_params(self) -> tuple[str, ...]:
        return tuple(re.findall(r"{(\w+)}", self.path))

    @property
    def query_names(self) -> dict[str, str]:
        return dict(_wire(name) for name in self.query)

    @property
    def body_names(self) -> dict[str, str]:
        return dict(_wire(name) for name in self.body)

    def call(self, **args: Any) -> Call:
        """The request for these arguments (SDK names); None leaves an argument out."""
        query, body = self.query_names, self.body_names
        unknown = set(args) - set(self.path_params) - set(query) - set(body)
        if unknown:
            raise TypeError(f"{self.method} {self.path} takes no {', '.join(sorted(unknown))}")
        path = self.path.format(**{name: quote(str(args[name]), safe="") for name in self.path_params})
        params = {
            wire: _query_value(args[name]) for name, wire in query.items() if args.get(name) is not None
        }
        json = {wire: _json_value(args[name]) for name, wire in body.items() if args.get(name) is not None}
        sends_body = self.method in ("POST", "PUT", "PATCH") and bool(body)
        return Call(self.method, path, params, json if sends_body else None, self.returns)


def _wire(name: str) -> tuple[str, str]:
    sdk, _, wire = name.partition(":")
    return sdk, wire or camel(sdk)


def _query_value(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return ",".join(map(str, value))
    return _json_value(value)


def _json_value(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    return value


def pages(call: Call, page_size: int = 200) -> Stream[Any]:
    """Emit every item of a paged list, fetching page after page."""
    page = 1
    while True:
        data = yield Call(
            call.method, call.path, {**call.params, "page": page, "pageSize": page_size}, None, dict
        )
        for item in data["results"]:
            yield Emit(decode(call.returns, item))
        if not data.get("next"):
            return
        page += 1


# Typed answers


def decode(tp: Any, data: Any) -> Any:
    """JSON into the SDK's model types (dataclasses with snake_case fields, lists, dates, decimals)."""
    if data is None or tp is Any or tp is dict:
        return data
    origin = get_origin(tp)
    if origin in (Union, UnionType):
        return decode(next(arg for arg in get_args(tp) if arg is not NoneType), data)
    if origin is list:
        return [decode(get_args(tp)[0], item) for item in data]
    if origin is dict:
        return {key: decode(get_args(tp)[1], value) for key, value in data.items()}
    if is_dataclass(tp) and isinstance(tp, type):
        hints = get_type_hints(tp)
        return tp(**{f.name: decode(hints[f.name], data.get(camel(f.name))) for f in fields(tp)})
    if tp is datetime:
        return datetime.fromisoformat(data)
    if tp is date:
        return date.fromisoformat(data)
    if tp is Decimal:
        return Decimal(str(data))
    return data


# Methods made of plans


class Mode:
    """Which client a resource belongs to: `Sync` or `Async` (for the type checker)."""


class Sync(Mode):
    pass


class Async(Mode):
    pass


class Resource(Generic[M]):
    def __init__(self, runner: Runner):
        self._runner = runner


class Method(Generic[P, T]):
    """An SDK method standing for `endpoint`, written as a plan and run by the client it is called on.
    `local` names the method's own parameters (not the API's), `fixes` the endpoint's parameters the
    method sets itself."""

    streams = False

    def __init__(
        self, fn: Callable[..., Plan[Any]], endpoint: Endpoint, local: tuple[str, ...], fixes: tuple[str, ...]
    ):
        self.fn, self.endpoint, self.local, self.fixes = fn, endpoint, local, fixes
        self.signature = inspect.signature(fn)
        functools.update_wrapper(cast(Any, self), fn)
        OPERATIONS.append(self)

    def _bind(self, obj: Resource[Any]) -> Callable[..., Any]:
        runner = obj._runner
        start = runner.stream if self.streams else runner.run
        bound = functools.partial(self.fn, obj)
        method = functools.wraps(self.fn)(lambda *args, **kwargs: start(bound(*args, **kwargs)))
        method.__signature__ = self.signature.replace(  # type: ignore[attr-defined]
            parameters=list(self.signature.parameters.values())[1:], return_annotation=inspect.Signature.empty
        )
        return method


class Operation(Method[P, T]):
    """Called on a `Client`'s resource it returns the answer, on an `AsyncClient`'s an awaitable of it."""

    @overload
    def __get__(self, obj: None, owner: type) -> Operation[P, T]: ...
    @overload
    def __get__(self, obj: Resource[Sync], owner: type) -> Callable[P, T]: ...
    @overload
    def __get__(self, obj: Resource[Async], owner: type) -> Callable[P, Awaitable[T]]: ...
    def __get__(self, obj, owner):
        return self if obj is None else self._bind(obj)


class StreamOperation(Method[P, T]):
    """A method whose answer comes item by item: an iterator on a `Client`, an async iterator on an
    `AsyncClient` (lists, fetched page by page; a growing chat answer)."""

    streams = True

    @overload
    def __get__(self, obj: None, owner: type) -> StreamOperation[P, T]: ...
    @overload
    def __get__(self, obj: Resource[Sync], owner: type) -> Callable[P, Iterator[T]]: ...
    @overload
    def __get__(self, obj: Resource[Async], owner: type) -> Callable[P, AsyncIterator[T]]: ...
    def __get__(self, obj, owner):
        return self if obj is None else self._bind(obj)


OPERATIONS: list[Method] = []


def operation(
    endpoint: Endpoint, *, local: tuple[str, ...] = (), fixes: tuple[str, ...] = ()
) -> Callable[[Callable[Concatenate[Any, P], Plan[T]]], Operation[P, T]]:
    return lambda fn: Operation(fn, endpoint, local, fixes)


def streaming(
    endpoint: Endpoint, *, local: tuple[str, ...] = (), fixes: tuple[str, ...] = ()
) -> Callable[[Callable[Concatenate[Any, P], Stream[T]]], StreamOperation[P, T]]:
    """A method emitting items of type T (its plan yields `Emit[T]`s)."""
    return lambda fn: StreamOperation(fn, endpoint, local, fixes)


# Running plans: HTTP, retries, errors

RETRIED = (429, 503)


@dataclass
class Settings:
    base_url: str
    api_key: str
    timeout: float = 30.0
    max_retries: int = 4
    backoff: float = 0.5
    backoff_max: float = 20.0


def _delay(settings: Settings, attempt: int, response: httpx.Response) -> float:
    """Retry-After when the server says, else exponential backoff with jitter."""
    after = response.headers.get("Retry-After", "")
    if after.isdigit():
        return min(float(after), settings.backoff_max)
    return min(settings.backoff * 2**attempt, settings.backoff_max) * (0.5 + random.random() / 2)  # noqa: S311


def _request(call: Call) -> dict[str, Any]:
    request = {"method": call.method, "url": call.path, "params": call.params}
    if call.content is not None:
        return {**request, "content": call.content, "headers": {"Content-Type": "application/octet-stream"}}
    return {**request, "json": call.json}


def _result(call: Call, response: httpx.Response) -> Any:
    if response.status_code >= 400:
        raise error_from(response)
    if call.returns is bytes:
        return response.content
    if call.returns is Binary:
        return Binary(response.content, response.headers.get("content-type", ""), dict(response.headers))
    if call.returns is None or response.status_code == 204:
        return None
    return decode(call.returns, response.json())


def _headers(settings: Settings) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {settings.api_key}",
        "User-Agent": f"lebureau-sdk/{version('lebureau-sdk')}",
    }


class Runner(Protocol):
    """Runs plans for a client (`run`: the plan's value; `stream`: the items it emits)."""

    def run(self, plan: Plan[Any]) -> Any: ...

    def stream(self, plan: Plan[Any]) -> Any: ...


class SyncRunner:
    def __init__(self, settings: Settings, transport: httpx.BaseTransport | None = None):
        self.settings = settings
        self.http = httpx.Client(
            base_url=settings.base_url,
            headers=_headers(settings),
            timeout=settings.timeout,
            transport=transport,
        )

    def run(self, plan: Plan[T]) -> T:
        steps = self._drive(plan)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def stream(self, plan: Plan[Any]) -> Iterator[Any]:
        return self._drive(plan)

    def _drive(self, plan: Plan[T]) -> Generator[Any, None, T]:
        value: Any = None
        error: Exception | None = None
        while True:
            try:
                step = plan.throw(error) if error else plan.send(value)
            except StopIteration as done:
                return done.value
            value, error = None, None
            if isinstance(step, Emit):
                yield step.value
            elif isinstance(step, Sleep):
                time.sleep(step.seconds)
            else:
                try:
                    value = self._send(step)
                except Exception as exc:  # handed to the plan, which may expect it (waits do)
                    error = exc

    def _send(self, call: Call) -> Any:
        for attempt in range(self.settings.max_retries + 1):
            response = self.http.request(**_request(call))
            if response.status_code not in RETRIED or attempt == self.settings.max_retries:
                break
            time.sleep(_delay(self.settings, attempt, response))
        return _result(call, response)

    def close(self) -> None:
        self.http.close()


class AsyncRunner:
    def __init__(self, settings: Settings, transport: httpx.AsyncBaseTransport | None = None):
        self.settings = settings
        self.http = httpx.AsyncClient(
            base_url=settings.base_url,
            headers=_headers(settings),
            timeout=settings.timeout,
            transport=transport,
        )

    async def run(self, plan: Plan[T]) -> T:
        outcome: list[T] = []
        async for _item in self._drive(plan, outcome):
            pass
        return outcome[0]

    def stream(self, plan: Plan[Any]) -> AsyncIterator[Any]:
        return self._drive(plan, [])

    async def _drive(self, plan: Plan[T], outcome: list[T]) -> AsyncIterator[Any]:
        value: Any = None
        error: Exception | None = None
        while True:
            try:
                step = plan.throw(error) if error else plan.send(value)
            except StopIteration as done:
                outcome.append(done.value)
                return
            value, error = None, None
            if isinstance(step, Emit):
                yield step.value
            elif isinstance(step, Sleep):
                await anyio.sleep(step.seconds)
            else:
                try:
                    value = await self._send(step)
                except Exception as exc:
                    error = exc

    async def _send(self, call: Call) -> Any:
        for attempt in range(self.settings.max_retries + 1):
            response = await self.http.request(**_request(call))
            if response.status_code not in RETRIED or attempt == self.settings.max_retries:
                break
            await anyio.sleep(_delay(self.settings, attempt, response))
        return _result(call, response)

    async def aclose(self) -> None:
        await self.http.aclose()
