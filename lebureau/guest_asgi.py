"""The guest endpoint's server: the one listener desktops may reach (`GUEST_URL`).

It runs the same Django project under its own settings (`lebureau.guest_settings`: the middleware a
desktop's calls need alone), and every request it takes is resolved against the guest URLs alone
(`lebureau.guest_urls`), whatever its path: Mission Control, the API, the admin and the static files
are not served here.
"""

import os

from django.core.asgi import get_asgi_application
from django.core.handlers.asgi import ASGIHandler

# Not setdefault: a process started with the project's settings in its environment still gets these.
os.environ["DJANGO_SETTINGS_MODULE"] = "lebureau.guest_settings"
get_asgi_application()  # sets Django up

GUEST_URLCONF = "lebureau.guest_urls"


class GuestHandler(ASGIHandler):
    def create_request(self, scope, body_file):
        request, error = super().create_request(scope, body_file)
        if request is not None:
            request.urlconf = GUEST_URLCONF
        return request, error


application = GuestHandler()
