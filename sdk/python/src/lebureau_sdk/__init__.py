"""Le Bureau's Python SDK: persistent cloud desktops for AI agents, from code.

from lebureau_sdk import Client
with Client() as client:
    desktop = client.desktops.create("ci-agent", wait=True)
    print(client.chat.ask(desktop.id, "Lance la suite de tests").content)
"""

from importlib.metadata import version

from lebureau_sdk import models
from lebureau_sdk.client import AsyncClient, Client
from lebureau_sdk.config import NotConfigured
from lebureau_sdk.errors import (
    AuthenticationError,
    ConflictError,
    EmailUnconfirmedError,
    InvalidError,
    LeBureauError,
    NotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    RateLimitedError,
    ServerError,
    TooLargeError,
    UnavailableError,
    WaitTimeout,
)

__version__ = version("lebureau-sdk")
__all__ = [
    "AsyncClient",
    "AuthenticationError",
    "Client",
    "ConflictError",
    "EmailUnconfirmedError",
    "InvalidError",
    "LeBureauError",
    "NotConfigured",
    "NotFoundError",
    "PermissionDeniedError",
    "QuotaExceededError",
    "RateLimitedError",
    "ServerError",
    "TooLargeError",
    "UnavailableError",
    "WaitTimeout",
    "models",
]
