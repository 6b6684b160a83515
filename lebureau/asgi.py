import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lebureau.settings")
django_asgi_app = get_asgi_application()

# Imported once Django is set up.
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402
from channels.sessions import CookieMiddleware  # noqa: E402

from proxies.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        # Relays authenticate by a single-use ticket, bound to the browser session (its cookie) that
        # minted it; the origin check stops other sites' pages.
        "websocket": AllowedHostsOriginValidator(CookieMiddleware(URLRouter(websocket_urlpatterns))),
    }
)
