"""The API's errors in its OpenAPI schema: one shape, ``{"error": {"code", "message", "fields"?}}``
(``errors.py``), documented once and referenced by every error answer an operation can give."""

from django.utils.translation import gettext as _

ERROR = "Error"
RETRY_AFTER = {"schema": {"type": "integer"}, "description": "Seconds to wait before trying again."}


def _error_schema() -> dict:
    return {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {
                        "type": "string",
                        "description": _("Why, for a program: invalid, not_found, conflict…"),
                    },
                    "message": {"type": "string", "description": _("Why, for a person.")},
                    "fields": {
                        "type": "object",
                        "additionalProperties": {},
                        "description": _("For invalid input: what is wrong with each field."),
                    },
                },
            }
        },
    }


def _common_errors(operation: dict) -> dict[str, str]:
    """The error statuses any operation may answer; a view documents its own others (409)."""
    errors = {
        "401": _("No valid API key or session."),
        "403": _("Not allowed: a read-only key that writes, or a role below what this needs."),
        "404": _("Not found, or not visible to you; or a page past the last."),
        "429": _(
            "Too many calls of this kind by you, or too many of yours still running: try again after "
            "Retry-After seconds."
        ),
    }
    queried = any(p["in"] == "query" for p in operation.get("parameters", []))
    if queried or "requestBody" in operation:
        errors["400"] = _("Invalid input; fields names each field's problems.")
    return errors


def document_errors(result, generator, request, public):
    """drf-spectacular postprocessing hook: give each operation its error answers, in the one shape."""
    result.setdefault("components", {}).setdefault("schemas", {})[ERROR] = _error_schema()
    content = {"application/json": {"schema": {"$ref": f"#/components/schemas/{ERROR}"}}}
    for methods in result.get("paths", {}).values():
        for operation in methods.values():
            responses = operation.setdefault("responses", {})
            for status, description in _common_errors(operation).items():
                responses.setdefault(status, {"description": description})
            for status, response in responses.items():
                if status.startswith("4"):
                    response["content"] = content
            responses["429"]["headers"] = {"Retry-After": RETRY_AFTER}
    return result
