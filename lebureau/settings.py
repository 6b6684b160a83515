"""All configuration comes from environment variables (or a `.env` file beside manage.py).

Typed helpers fail loudly: a missing secret or a malformed value stops start-up
with the variable's name instead of running half-configured.
"""

import ipaddress
from pathlib import Path
from urllib.parse import urlsplit

from celery.schedules import crontab
from django.core.exceptions import ImproperlyConfigured
from environs import Env, validate

BASE_DIR = Path(__file__).resolve().parent.parent

env = Env()
env.read_env(BASE_DIR / ".env", recurse=False)

DEBUG = env.bool("DJANGO_DEBUG", False)
SECRET_KEY = env.str("SECRET_KEY")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
# What desktops dial to reach the control plane: the guest endpoint, a listener of its own that serves
# nothing else (`lebureau.guest_asgi`, GUEST_PORT), on the desktops' side of the host. Their firewall
# lets them reach this port of the host and no other (LXC_HOST_TCP_PORTS).
GUEST_URL = env.str("GUEST_URL", "http://10.213.0.1:8001")
ALLOWED_HOSTS.append(urlsplit(GUEST_URL).hostname)
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", [])
SITE_URL = env.str("SITE_URL", "http://127.0.0.1:8000")

# A deployment cannot start insecure by accident: debug mode only on this machine's own address, a
# strong secret key, and HTTPS (Secure cookies, HSTS) wherever Mission Control is not on loopback.
_site = urlsplit(SITE_URL)
_LOOPBACK = {"localhost", "127.0.0.1", "::1"}
if DEBUG and _site.hostname not in _LOOPBACK:
    raise ImproperlyConfigured(f"DJANGO_DEBUG=true is for development on this machine, not at {SITE_URL}.")
if not DEBUG and (
    len(SECRET_KEY) < 50 or len(set(SECRET_KEY)) < 5 or SECRET_KEY.startswith("django-insecure")
):
    raise ImproperlyConfigured(
        "SECRET_KEY is weak: use 50 random characters or more (make setup writes one)."
    )
if _site.scheme != "https" and _site.hostname not in _LOOPBACK:
    raise ImproperlyConfigured(f"SITE_URL must be https:// outside this machine (it is {SITE_URL}).")
HTTPS = _site.scheme == "https"
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = HTTPS
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", 365 * 24 * 3600) if HTTPS else 0
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", HTTPS)
# Behind a TLS-terminating proxy: the header it sets, e.g. "X-Forwarded-Proto:https".
if env.str("SECURE_PROXY_SSL_HEADER", ""):
    SECURE_PROXY_SSL_HEADER = tuple(env.str("SECURE_PROXY_SSL_HEADER").split(":", 1))
SESSION_COOKIE_HTTPONLY = True
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
# Pages load their scripts, styles and libraries from here only, and are never framed elsewhere.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        # xterm.js and Swagger UI add <style> elements of their own.
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:", "blob:"],
        "connect-src": ["'self'"],
        "worker-src": ["'self'", "blob:"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],
        "frame-ancestors": ["'none'"],
    }
}

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "allauth",
    "allauth.account",
    "django_eventstream",
    "csp",
    "desktops",
    "workers",
    "proxies",
    "missioncontrol",
    "billing",
]

MIDDLEWARE = [
    "desktops.middleware.RequestContextMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The browser's language by default (French or English), after the session is known.
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "csp.middleware.CSPMiddleware",
    "allauth.account.middleware.AccountMiddleware",
]

ROOT_URLCONF = "lebureau.urls"
ASGI_APPLICATION = "lebureau.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.dj_db_url("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/lebureau")}
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", 60)
# A connection kept between requests or tasks, or lent by the pool, may have been cut meanwhile
# (PostgreSQL restarted): it is tried before its first use and replaced if dead, rather than failing
# that request or task.
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
# The web server runs each request in a thread of its own: without a pool, a burst of requests opens
# as many connections and PostgreSQL refuses the ones past max_connections (a 500 each). With a pool
# (the Procfile's web process sets it), requests wait their turn for one of at most this many.
DATABASE_POOL_MAX = env.int("DATABASE_POOL_MAX", 0)
if DATABASE_POOL_MAX:
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps them
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": DATABASE_POOL_MAX,
        "timeout": env.float("DATABASE_POOL_TIMEOUT", 30.0),
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.str("REDIS_URL", "redis://127.0.0.1:6379/0")
# Shared by every process: the sign-in rate limits count across them all.
CACHES = {
    "default": {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": env.str("CACHE_REDIS_URL", "redis://127.0.0.1:6379/3"),
    }
}

AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "allauth.account.auth_backends.AuthenticationBackend",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
LOGIN_REDIRECT_URL = "/"
ACCOUNT_ADAPTER = "missioncontrol.accounts.AccountAdapter"
ACCOUNT_LOGIN_METHODS = {"email"}
ACCOUNT_SIGNUP_FIELDS = ["email*", "password1*", "password2*"]
ACCOUNT_EMAIL_VERIFICATION = env.str("ACCOUNT_EMAIL_VERIFICATION", "optional")
EMAIL_BACKEND = env.str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
# With EMAIL_BACKEND=django.core.mail.backends.smtp.EmailBackend in production:
EMAIL_HOST = env.str("EMAIL_HOST", "localhost")
EMAIL_PORT = env.int("EMAIL_PORT", 25)
EMAIL_HOST_USER = env.str("EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env.str("EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env.bool("EMAIL_USE_TLS", False)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", "Le Bureau <noreply@localhost>")

LANGUAGE_CODE = "en-us"
LANGUAGES = [("fr", "Français"), ("en", "English")]
LOCALE_PATHS = [BASE_DIR / "locale"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "missioncontrol" / "static"]

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "desktops.api.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["desktops.api.permissions.IsAuthenticatedWithScope"],
    "DEFAULT_RENDERER_CLASSES": [
        "djangorestframework_camel_case.render.CamelCaseJSONRenderer",
        "desktops.api.rendering.BrowsableAPIRenderer",
    ],
    "DEFAULT_METADATA_CLASS": "desktops.api.rendering.Metadata",
    "DEFAULT_PARSER_CLASSES": ["desktops.api.parsing.JSONParser"],
    "DEFAULT_PAGINATION_CLASS": "desktops.api.pagination.Pagination",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "desktops.api.errors.exception_handler",
    "DEFAULT_THROTTLE_CLASSES": ["desktops.api.throttling.ActorRateThrottle"],
    # Per person (per desktop on the guest endpoint), as "number/second|minute|hour|day".
    "DEFAULT_THROTTLE_RATES": {
        scope: env.str(f"API_RATE_{scope.upper()}", rate)
        for scope, rate in {
            "exec": "60/min",
            "actions": "120/min",
            "screenshot": "120/min",
            "chat": "30/min",
            "relay": "60/min",
            "invitations": "30/hour",
            "approvals": "30/min",
        }.items()
    },
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Le Bureau API",
    "DESCRIPTION": "Persistent cloud desktops for AI agents. Authenticate with `Authorization: Bearer <key>`",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The docs page is served from our own static files, never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "CAMELIZE_NAMES": True,
    # Request bodies get components of their own, so the constraints that only bind input (no blank
    # strings, write-only fields) are in the schema.
    "COMPONENT_SPLIT_REQUEST": True,
    # Two fields are named `mode`: a relay's (view or control) and an egress policy's.
    "ENUM_NAME_OVERRIDES": {"EgressModeEnum": "desktops.models.EgressMode"},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.contrib.djangorestframework_camel_case.camelize_serializer_fields",
        "drf_spectacular.hooks.postprocess_schema_enums",
        "desktops.api.schema.document_errors",
    ],
}

# Platform API keys are stored as an HMAC of the secret; this key never leaves the server.
API_KEY_HMAC_SECRET = env.str("API_KEY_HMAC_SECRET")
# Fernet keys (comma-separated, newest first) encrypting BYOK LLM keys at rest; old ones still decrypt.
LLM_KEY_ENCRYPTION_KEYS = env.list("LLM_KEY_ENCRYPTION_KEYS", validate=validate.Length(min=1))

CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_DEFAULT_QUEUE = env.str("CELERY_QUEUE", "lebureau")
# Following agent turns has a queue and workers of its own (a thread pool: a turn mostly waits), so
# however long the turns, lifecycle steps never wait behind them.
CELERY_CHAT_QUEUE = env.str("CELERY_CHAT_QUEUE", f"{CELERY_TASK_DEFAULT_QUEUE}-chat")
# So have notifications (e-mails, webhooks, approvals' screenshots): what a desktop or a tenant's
# webhook receiver sets off never waits in front of the lifecycle steps.
CELERY_NOTIFY_QUEUE = env.str("CELERY_NOTIFY_QUEUE", f"{CELERY_TASK_DEFAULT_QUEUE}-notify")
NOTIFY_TASKS = (
    "workers.tasks.approval_screenshot",
    "workers.tasks.approval_email",
    "workers.tasks.alert_email",
    "workers.tasks.webhook_deliver",
)


def task_routes(chat_queue: str, notify_queue: str) -> dict:
    chat = ("workers.tasks.chat_deliver", "workers.tasks.chat_follow")
    return {name: {"queue": chat_queue} for name in chat} | {
        name: {"queue": notify_queue} for name in NOTIFY_TASKS
    }


CELERY_TASK_ROUTES = task_routes(CELERY_CHAT_QUEUE, CELERY_NOTIFY_QUEUE)
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A task whose worker died (kill -9, a lost machine) goes back to the queue once it has been unacknowledged
# for the visibility timeout, which must outlast the longest step (930 s). Workers look for such tasks
# every few seconds (a tenth of the timeout, at most every 10 s), not kombu's default of every 100 s.
CELERY_VISIBILITY_TIMEOUT = env.int("CELERY_VISIBILITY_TIMEOUT", 3600)
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": CELERY_VISIBILITY_TIMEOUT,
    "unacked_restore_interval": max(1, min(10, CELERY_VISIBILITY_TIMEOUT // 10)),
    "unacked_restore_throttle": 1,
}
CELERY_BEAT_SCHEDULE = {
    "reconcile": {"task": "workers.tasks.reconcile", "schedule": env.float("RECONCILE_INTERVAL", 60.0)},
}

# Agent turns: how long one may run, and after how long without a worker's heartbeat another
# worker picks it up (the turn itself keeps running in the desktop meanwhile).
CHAT_TURN_TIMEOUT = env.int("CHAT_TURN_TIMEOUT", 24 * 3600)
CHAT_STALE_AFTER = env.float("CHAT_STALE_AFTER", 60.0)
# One workspace never takes more than these worker slots, so no tenant can fill a queue: turns
# followed at once, and lifecycle steps (create, start, stop…) carried out at once.
CHAT_TURNS_PER_WORKSPACE = env.int("CHAT_TURNS_PER_WORKSPACE", 4)
LIFECYCLE_STEPS_PER_WORKSPACE = env.int("LIFECYCLE_STEPS_PER_WORKSPACE", 2)
# And notifications under way at once (a webhook receiver that never answers holds one for its timeout).
NOTIFY_TASKS_PER_WORKSPACE = env.int("NOTIFY_TASKS_PER_WORKSPACE", 2)
# Reconcile: a step waiting this long with no worker on it is sent again (its task may have been lost
# with the broker's memory), and past the second it was lost for good (the longest step's time limit is
# 930 s); an instance no desktop knows is removed once it has been seen this long.
LIFECYCLE_REQUEUE_AFTER = env.int("LIFECYCLE_REQUEUE_AFTER", 120)
LIFECYCLE_STUCK_AFTER = env.int("LIFECYCLE_STUCK_AFTER", 1800)
ORPHAN_GRACE = env.int("ORPHAN_GRACE", 3600)
# Webhooks (approvals): how long a receiver may take to answer, how many times a delivery is tried,
# and the private, loopback or link-local networks they may reach all the same (a receiver on a closed
# network, the tests' own): CIDRs, comma-separated.
WEBHOOK_TIMEOUT = env.float("WEBHOOK_TIMEOUT", 10.0)
WEBHOOK_ATTEMPTS = env.int("WEBHOOK_ATTEMPTS", 8)
WEBHOOK_ALLOWED_NETWORKS = env.list("WEBHOOK_ALLOWED_NETWORKS", [], subcast=ipaddress.ip_network)
# Requests for approval nobody answered in time are refused.
CELERY_BEAT_SCHEDULE["approvals-expire"] = {
    "task": "workers.tasks.approvals_expire",
    "schedule": 30.0,
    "options": {"expires": 30.0},
}
# Alerts (desktops/alerts.py): their rules run over every live desktop this often.
ALERTS_INTERVAL = env.float("ALERTS_INTERVAL", 30.0)
CELERY_BEAT_SCHEDULE["alerts-evaluate"] = {
    "task": "workers.tasks.alerts_evaluate",
    "schedule": ALERTS_INTERVAL,
    "options": {"expires": ALERTS_INTERVAL},
}

# The audit trail: events older than this many days are pruned every AUDIT_PRUNE_INTERVAL seconds
# (0 keeps them all), leaving a checkpoint signed with AUDIT_CHECKPOINT_KEY (HMAC-SHA256) from which
# what remains still verifies (`manage.py audit_verify`).
AUDIT_RETENTION_DAYS = env.int("AUDIT_RETENTION_DAYS", 0, validate=validate.Range(min=0))
AUDIT_CHECKPOINT_KEY = env.str("AUDIT_CHECKPOINT_KEY", "")
# Each event's hash is an HMAC under this key (SECRET_KEY's when unset), which the database never holds:
# whoever can rewrite the trail's rows (the app's own role) cannot chain forged ones. Changing it
# (or SECRET_KEY, unset) makes the chain written before fail verification.
AUDIT_CHAIN_KEY = env.str("AUDIT_CHAIN_KEY", "")
AUDIT_PRUNE_INTERVAL = env.float("AUDIT_PRUNE_INTERVAL", 3600.0)
# Beat copies the chain's head here every AUDIT_HEAD_EXPORT_INTERVAL seconds when it moved (a JSON line,
# signed under the chain's key): outside the database, where its role cannot cut the chain's newest
# events and move the head back unseen. Put it where the app's host cannot rewrite it either (a mount
# from a log host, a file a shipper forwards); empty turns the export off.
AUDIT_HEAD_LOG = env.str("AUDIT_HEAD_LOG", str(BASE_DIR / "var" / "audit-head.jsonl"))
AUDIT_HEAD_EXPORT_INTERVAL = env.float("AUDIT_HEAD_EXPORT_INTERVAL", 60.0)
if AUDIT_HEAD_LOG:
    CELERY_BEAT_SCHEDULE["audit-head-export"] = {
        "task": "workers.tasks.audit_head_export",
        "schedule": AUDIT_HEAD_EXPORT_INTERVAL,
        "options": {"expires": AUDIT_HEAD_EXPORT_INTERVAL},
    }
if AUDIT_RETENTION_DAYS:
    if not AUDIT_CHECKPOINT_KEY:
        raise ImproperlyConfigured("AUDIT_RETENTION_DAYS needs AUDIT_CHECKPOINT_KEY to sign what it prunes")
    CELERY_BEAT_SCHEDULE["audit-prune"] = {
        "task": "workers.tasks.audit_prune",
        "schedule": AUDIT_PRUNE_INTERVAL,
        "options": {"expires": AUDIT_PRUNE_INTERVAL},
    }
CELERY_BEAT_SCHEDULE["chat-resume"] = {
    "task": "workers.tasks.chat_resume",
    "schedule": CHAT_STALE_AFTER / 2,
    "options": {"expires": CHAT_STALE_AFTER / 2},
}

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {"hosts": [env.str("CHANNELS_REDIS_URL", "redis://127.0.0.1:6379/1")]},
    }
}

# Live pages: server-sent events, kept in Redis for replay and fanned out across processes by it, so an
# open page holds no database connection.
EVENTSTREAM_REDIS = {
    "host": env.str("EVENTSTREAM_REDIS_HOST", "127.0.0.1"),
    "port": env.int("EVENTSTREAM_REDIS_PORT", 6379),
    "db": env.int("EVENTSTREAM_REDIS_DB", 2),
}
EVENTSTREAM_STORAGE_CLASS = "django_eventstream.storage.RedisStorage"
EVENTSTREAM_STORAGE_CONNECTION = EVENTSTREAM_REDIS
EVENTSTREAM_CHANNELMANAGER_CLASS = "missioncontrol.streams.WorkspaceStreams"

# Which compute engine runs new desktops: a registered name ("lxc", "proxmox") or a dotted path. Each
# engine reads its own options from the environment (workers/drivers/<engine>/config.py); its periodic
# work runs from the one generic beat job below.
COMPUTE_DRIVER = env.str("COMPUTE_DRIVER", "lxc")
ENGINE_MAINTENANCE_INTERVAL = env.float("ENGINE_MAINTENANCE_INTERVAL", 60.0)
CELERY_BEAT_SCHEDULE["engine-maintenance"] = {
    "task": "workers.tasks.engine_maintenance",
    "schedule": ENGINE_MAINTENANCE_INTERVAL,
    "options": {"expires": ENGINE_MAINTENANCE_INTERVAL},
}
# Where the control plane keeps its SSH key pair for reaching desktops.
CONTROL_PLANE_SSH_KEY = env.path("CONTROL_PLANE_SSH_KEY", BASE_DIR / "var" / "ssh" / "id_ed25519")
# Transient driver errors are retried with exponential backoff, this many times, waiting at most this long.
DRIVER_RETRY_MAX = env.int("DRIVER_RETRY_MAX", 6)
DRIVER_RETRY_BACKOFF_MAX = env.int("DRIVER_RETRY_BACKOFF_MAX", 60)
# Relays: a ticket opens one VNC or terminal relay within this many seconds of being minted; a person
# keeps at most this many relays open at once.
RELAY_TOKEN_MAX_AGE = env.int("RELAY_TOKEN_MAX_AGE", 60)
RELAY_MAX_PER_USER = env.int("RELAY_MAX_PER_USER", 8)
# What the relays dial inside a desktop.
DESKTOP_VNC_PORT = env.int("DESKTOP_VNC_PORT", 5900)
DESKTOP_SSH_PORT = env.int("DESKTOP_SSH_PORT", 22)
DESKTOP_SSH_USER = env.str("DESKTOP_SSH_USER", "agent")
# The largest request body the REST API reads (it takes small JSON documents).
API_MAX_BODY_BYTES = env.int("API_MAX_BODY_BYTES", 256 * 1024)
# Refused by the web server from their headers: a body larger than any endpoint takes (keep it at least
# the largest plan's transfer_max_mib), and bodies past what those being received may hold of the disk
# together.
WEB_MAX_BODY_MIB = env.int("WEB_MAX_BODY_MIB", 4096)
WEB_BODIES_ON_DISK_MIB = env.int("WEB_BODIES_ON_DISK_MIB", 16384)
# Commands, downloads and screen actions of one person (or one desktop's agent) running at once.
LONG_CALLS_PER_PERSON = env.int("LONG_CALLS_PER_PERSON", 4)
DEFAULT_PLAN = env.str("DEFAULT_PLAN", "starter")
DEFAULT_IMAGE_PROFILE = env.str("DEFAULT_IMAGE_PROFILE", "full")
# The tier new workspaces go on (each keeps it until support changes it).
DEFAULT_TIER = env.str("DEFAULT_TIER", "free")
# Workspaces on a tier without a fee that one person may own (quotas are per workspace).
FREE_WORKSPACES_PER_PERSON = env.int("FREE_WORKSPACES_PER_PERSON", 1)
# On a tier without a fee, desktops are made and started only once an owner of the workspace has
# confirmed their e-mail address (one mailbox per free workspace); not by default on a development
# machine, which sends no mail.
FREE_TIER_NEEDS_CONFIRMED_EMAIL = env.bool("FREE_TIER_NEEDS_CONFIRMED_EMAIL", not DEBUG)
# Platform e-mail carries words its senders chose: bounded, so that it cannot serve as a spam relay.
INVITATIONS_PER_DAY = env.int("INVITATIONS_PER_DAY", 20)  # sent by one workspace
APPROVAL_EMAILS_PER_HOUR = env.int("APPROVAL_EMAILS_PER_HOUR", 10)  # about one desktop's requests
# Billing's periodic work: measure every desktop's disk (storage is billed in GiB-hours of those
# measures), then record the workspaces whose spend reached 80 % or 100 % of their cap.
BILLING_METER_INTERVAL = env.float("BILLING_METER_INTERVAL", 600.0)
CELERY_BEAT_SCHEDULE["billing-meter"] = {
    "task": "workers.tasks.billing_meter",
    "schedule": BILLING_METER_INTERVAL,
    "options": {"expires": BILLING_METER_INTERVAL},
}

# Scheduled messages: beat claims the due ones at the start of every minute (desktops/schedules.py).
CELERY_BEAT_SCHEDULE["schedules"] = {
    "task": "workers.tasks.schedules_run",
    "schedule": crontab(),
    "options": {"expires": 60},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", "INFO")},
}
