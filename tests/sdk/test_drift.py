"""The SDK against the app's own OpenAPI schema, both ways: no operation of the API without an SDK method,
no SDK method without its operation, the same parameters (names and which are required), and answers
decoded into models with exactly the schema's fields. When an endpoint lands in the API, the first test
names it until the SDK has a method for it.
"""

import inspect
import re
from dataclasses import fields, is_dataclass
from typing import get_args, get_origin, get_type_hints

import pytest
from drf_spectacular.generators import SchemaGenerator
from lebureau_sdk import AsyncClient, Client
from lebureau_sdk._core import ENDPOINTS, OPERATIONS, PAGING, Binary, Endpoint, Resource, camel

SCHEMA = SchemaGenerator().get_schema(request=None, public=True)
COMPONENTS = SCHEMA["components"]["schemas"]


def _key(method: str, path: str) -> tuple[str, str]:
    """A path as both sides spell it, whatever the names of its parameters and its trailing slash."""
    return method.upper(), re.sub(r"{\w+}", "{}", path.rstrip("/"))


OPERATIONS_IN_SCHEMA = {
    _key(method, path): operation
    for path, methods in SCHEMA["paths"].items()
    for method, operation in methods.items()
}


def _resolve(schema: dict) -> dict:
    if "$ref" in schema:
        return _resolve(COMPONENTS[schema["$ref"].split("/")[-1]])
    if "allOf" in schema:
        return _resolve(schema["allOf"][0])
    return schema


def _answer(operation: dict) -> tuple[dict | type[Binary] | None, bool]:
    """The schema of the operation's success answer (None: no body; Binary: not JSON, an image), and
    whether it is paged."""
    status = next(code for code in operation["responses"] if code.startswith("2"))
    answers = operation["responses"][status].get("content", {})
    content = answers.get("application/json")
    if content is None:
        return (Binary if answers else None), False
    schema = _resolve(content["schema"])
    if {"count", "next", "results"} <= set(schema.get("properties", {})):
        return _resolve(schema["properties"]["results"]["items"]), True
    return schema, False


def _request_fields(operation: dict) -> tuple[set[str], set[str]]:
    body = operation.get("requestBody", {}).get("content", {}).get("application/json")
    if body is None:
        return set(), set()
    schema = _resolve(body["schema"])
    return set(schema.get("properties", {})), set(schema.get("required", []))


def test_every_operation_of_the_api_has_an_sdk_method():
    covered = {_key(op.endpoint.method, op.endpoint.path) for op in OPERATIONS}
    missing = sorted(f"{method} {path}" for method, path in OPERATIONS_IN_SCHEMA.keys() - covered)
    assert not missing, "operations of the API the SDK lacks:\n" + "\n".join(missing)


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: f"{e.method} {e.path}")
def test_every_endpoint_of_the_sdk_is_an_operation_of_the_api(endpoint: Endpoint):
    operation = OPERATIONS_IN_SCHEMA.get(_key(endpoint.method, endpoint.path))
    assert operation is not None, f"{endpoint.method} {endpoint.path} is not in the API"
    assert any(op.endpoint is endpoint for op in OPERATIONS), "declared, but no SDK method calls it"
    in_path = [p["name"] for p in operation.get("parameters", []) if p["in"] == "path"]
    assert len(in_path) == len(endpoint.path_params)
    query = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
    answer, paged = _answer(operation)
    assert endpoint.paged == paged
    assert set(endpoint.query_names.values()) == query - (set(PAGING) if paged else set())
    body, _required = _request_fields(operation)
    assert set(endpoint.body_names.values()) == body
    assert (answer is None) == (endpoint.returns is None)
    assert (answer is Binary) == (endpoint.returns is Binary)
    if answer not in (None, Binary):
        _same_fields(endpoint.returns, answer, endpoint.returns.__name__)


def _same_fields(model, schema: dict, where: str) -> None:
    """The model has the schema's fields, no more and no fewer, and so have the models inside it."""
    properties = schema.get("properties", {})
    mine = {camel(f.name): f for f in fields(model)}
    assert set(mine) == set(properties), (
        f"{where}: the SDK lacks {sorted(set(properties) - set(mine))}, "
        f"the API lacks {sorted(set(mine) - set(properties))}"
    )
    hints = get_type_hints(model)
    for name, field in mine.items():
        inner, nested = hints[field.name], _resolve(properties[name])
        if get_origin(inner) is list:
            inner, nested = get_args(inner)[0], _resolve(nested.get("items", {}))
        inner = next((a for a in get_args(inner) if is_dataclass(a)), inner)
        if is_dataclass(inner):
            _same_fields(inner, nested, f"{where}.{field.name}")


@pytest.mark.parametrize("op", OPERATIONS, ids=lambda op: op.__qualname__)
def test_every_sdk_method_takes_its_operations_parameters(op):
    """Its parameters are the operation's (path, query, body; paging is the SDK's), and those the API
    requires have no default."""
    endpoint = op.endpoint
    takes = {name: p for name, p in list(op.signature.parameters.items())[1:] if name not in op.local}
    expected = {*endpoint.path_params, *endpoint.query_names, *endpoint.body_names} - set(op.fixes)
    assert set(takes) == expected
    _body, required = _request_fields(OPERATIONS_IN_SCHEMA[_key(endpoint.method, endpoint.path)])
    wire = {camel_name: sdk for sdk, camel_name in endpoint.body_names.items()}
    for name in required:
        assert takes[wire[name]].default is inspect.Parameter.empty, f"{wire[name]} is required by the API"


@pytest.mark.parametrize("client_class", [Client, AsyncClient])
def test_both_clients_have_every_method(client_class):
    client = client_class("http://127.0.0.1:9", "lb_unused")
    resources = {type(r).__name__: r for r in vars(client).values() if isinstance(r, Resource)}
    for op in OPERATIONS:
        assert callable(getattr(resources[op.__qualname__.split(".")[0]], op.__name__))
