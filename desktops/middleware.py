"""Carries the request's id and client IP to the services that write audit events."""

import uuid
from contextvars import ContextVar
from dataclasses import dataclass


@dataclass(frozen=True)
class RequestContext:
    request_id: str = ""
    ip: str | None = None


_NO_REQUEST = RequestContext()  # frozen, so sharing it as the default is safe
current_request: ContextVar[RequestContext] = ContextVar("current_request", default=_NO_REQUEST)


class RequestContextMiddleware:
    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        request.request_id = request.headers.get("X-Request-ID", "")[:64] or uuid.uuid4().hex
        token = current_request.set(
            RequestContext(request.request_id, request.META.get("REMOTE_ADDR") or None)
        )
        try:
            response = self.get_response(request)
        finally:
            current_request.reset(token)
        response["X-Request-ID"] = request.request_id
        return response
