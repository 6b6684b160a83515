"""Domain errors the services raise; the API and the pages turn them into responses."""


class DomainError(Exception):
    status = 400
    code = "invalid"

    def __init__(self, message: str, *, fields: dict[str, list[str]] | None = None):
        super().__init__(message)
        self.message = message
        self.fields = fields


class Invalid(DomainError):
    status, code = 400, "invalid"


class Forbidden(DomainError):
    status, code = 403, "permission_denied"


class NotFound(DomainError):
    status, code = 404, "not_found"


class Conflict(DomainError):
    status, code = 409, "conflict"


class QuotaExceeded(DomainError):
    """The workspace's tier allows no more of something: desktops, running ones, disk, spend this month."""

    status, code = 409, "quota_exceeded"


class Unconfirmed(DomainError):
    """Someone must confirm their e-mail address first (desktops run on a free tier once an owner has)."""

    status, code = 403, "email_unconfirmed"


class Unavailable(DomainError):
    """Something the request needs (an engine, a desktop's service) is not answering now."""

    status, code = 503, "unavailable"


class TooLarge(DomainError):
    """More than the plan lets through at once (a file, a folder)."""

    status, code = 413, "too_large"


class TooBusy(DomainError):
    """Too many of the caller's long calls run already; `retry_after` seconds is when to try again."""

    status, code = 429, "throttled"

    def __init__(self, message: str, *, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after
