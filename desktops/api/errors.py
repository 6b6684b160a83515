"""Every API error has one shape: {"error": {"code", "message", "fields"?}}."""

from django.http import Http404, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from djangorestframework_camel_case.util import camelize
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from desktops.errors import DomainError


def _first_message(detail) -> str:
    if isinstance(detail, dict):
        return _first_message(next(iter(detail.values()), ""))
    if isinstance(detail, list):
        return _first_message(detail[0]) if detail else ""
    return str(detail)


def error_body(code: str, message: str, fields: dict | None = None) -> dict:
    error = {"code": code, "message": message}
    if fields:
        error["fields"] = fields
    return {"error": error}


def exception_handler(exc, context):
    if isinstance(exc, DomainError):
        retry = getattr(exc, "retry_after", None)
        headers = {"Retry-After": str(retry)} if retry else None
        return Response(error_body(exc.code, exc.message, exc.fields), status=exc.status, headers=headers)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        fields = exc.detail if isinstance(exc.detail, dict) else {"nonFieldErrors": exc.detail}
        message = _first_message(fields)
        field = next(iter(camelize(fields)))
        if len(fields) == 1 and field != "nonFieldErrors":
            message = f"{field}: {message}"
        response.data = error_body("invalid", message, fields)
    else:
        code = exc.get_codes() if isinstance(exc, exceptions.APIException) else "error"
        response.data = error_body(code if isinstance(code, str) else "error", _first_message(exc.detail))
    return response


@csrf_exempt  # it changes nothing, and a POST must get this answer too, not CSRF's HTML page
def not_found(request, *args, **kwargs):
    """Unknown /api/ paths answer in the API's error shape, not with an HTML page."""
    return JsonResponse(
        error_body("not_found", f"No API endpoint at {request.path}."), status=status.HTTP_404_NOT_FOUND
    )
