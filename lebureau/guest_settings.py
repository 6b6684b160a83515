"""The guest endpoint's settings: the project's, with only the middleware a desktop's calls need. A
desktop that reaches this listener meets no sessions, CSRF cookies or static files: nothing of
Mission Control's. (ROOT_URLCONF stays the project's, for the links the guest endpoint's answers and
notifications carry; what the listener serves is `lebureau.guest_asgi`'s own.)"""

from lebureau.settings import *  # noqa: F403 (the project's, with what follows changed)

MIDDLEWARE = [
    "desktops.middleware.RequestContextMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # The agent's language for the answers' words, from its Accept-Language.
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    # allauth refuses to start without it (it keeps no session here: there is none).
    "allauth.account.middleware.AccountMiddleware",
]
