"""The API's errors as exceptions: `{"error": {"code", "message", "fields"?}}`, typed by its code."""

from __future__ import annotations

import httpx


class LeBureauError(Exception):
    """Any error answer of the API; `code` is the API's, `fields` says what is wrong with each input."""

    def __init__(self, message: str, *, status: int, code: str, fields: dict | None = None):
        super().__init__(message)
        self.message, self.status, self.code, self.fields = message, status, code, fields or {}

    def __str__(self) -> str:
        return f"{self.message} ({self.status} {self.code})"


class InvalidError(LeBureauError):
    """400: the input is wrong; `fields` names each field's problems."""


class AuthenticationError(LeBureauError):
    """401: no valid API key (missing, revoked, expired)."""


class PermissionDeniedError(LeBureauError):
    """403: a role below what this needs, or a read-only key that writes."""


class EmailUnconfirmedError(PermissionDeniedError):
    """403 email_unconfirmed: on a free tier, desktops run once an owner has confirmed their address."""


class NotFoundError(LeBureauError):
    """404: no such thing, or not visible to this key."""


class ConflictError(LeBureauError):
    """409: not allowed in the current state (stopping a stopped desktop, a name taken)."""


class QuotaExceededError(ConflictError):
    """409 quota_exceeded: the workspace's tier allows no more; the message names the quota."""


class TooLargeError(LeBureauError):
    """413: the request's body is larger than the API reads."""


class RateLimitedError(LeBureauError):
    """429, once the retries are spent."""


class UnavailableError(LeBureauError):
    """503, once the retries are spent: an engine or a desktop's service is not answering."""


class ServerError(LeBureauError):
    """5xx: the server failed."""


class WaitTimeout(LeBureauError):
    """A wait (for a state, an answer) ran out of time; raised by the SDK, not answered by the API."""

    def __init__(self, message: str):
        super().__init__(message, status=0, code="timeout")


BY_CODE = {
    "invalid": InvalidError,
    "parse_error": InvalidError,
    "not_authenticated": AuthenticationError,
    "authentication_failed": AuthenticationError,
    "permission_denied": PermissionDeniedError,
    "email_unconfirmed": EmailUnconfirmedError,
    "not_found": NotFoundError,
    "conflict": ConflictError,
    "quota_exceeded": QuotaExceededError,
    "too_large": TooLargeError,
    "throttled": RateLimitedError,
    "unavailable": UnavailableError,
}
BY_STATUS = {
    400: InvalidError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: TooLargeError,
    429: RateLimitedError,
    503: UnavailableError,
}


def error_from(response: httpx.Response) -> LeBureauError:
    """The exception for an error answer; one that is not the API's JSON keeps its status and text."""
    try:
        error = response.json()["error"]
        code, message, fields = str(error["code"]), str(error["message"]), error.get("fields")
    except (ValueError, KeyError, TypeError):
        code, message, fields = "error", response.text[:500] or response.reason_phrase, None
    kind = BY_CODE.get(code) or BY_STATUS.get(response.status_code)
    kind = kind or (ServerError if response.status_code >= 500 else LeBureauError)
    return kind(message, status=response.status_code, code=code, fields=fields)
