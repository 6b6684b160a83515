"""All configuration comes from environment variables (or a `.env` file beside manage.py).

Typed helpers fail loudly: a missing secret or a malformed value stops start-up
with the variable's name instead of running half-configured.
"""

from pathlib import Path

from environs import Env, validate

BASE_DIR = Path(__file__).resolve().parent.parent

env = Env()
env.read_env(BASE_DIR / ".env", recurse=False)

DEBUG = env.bool("DJANGO_DEBUG", False)
SECRET_KEY = env.str("SECRET_KEY")
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", [])
SITE_URL = env.str("SITE_URL", "http://127.0.0.1:8000")

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
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
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
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.str("REDIS_URL", "redis://127.0.0.1:6379/0")

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
        "djangorestframework_camel_case.render.CamelCaseBrowsableAPIRenderer",
    ],
    "DEFAULT_PARSER_CLASSES": ["djangorestframework_camel_case.parser.CamelCaseJSONParser"],
    "DEFAULT_PAGINATION_CLASS": "desktops.api.pagination.Pagination",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "desktops.api.errors.exception_handler",
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
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.contrib.djangorestframework_camel_case.camelize_serializer_fields",
        "drf_spectacular.hooks.postprocess_schema_enums",
    ],
}

# Platform API keys are stored as an HMAC of the secret; this key never leaves the server.
API_KEY_HMAC_SECRET = env.str("API_KEY_HMAC_SECRET")
# Fernet keys (comma-separated, newest first) encrypting BYOK LLM keys at rest; old ones still decrypt.
LLM_KEY_ENCRYPTION_KEYS = env.list("LLM_KEY_ENCRYPTION_KEYS", validate=validate.Length(min=1))

CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", REDIS_URL)
CELERY_RESULT_BACKEND = None
CELERY_TASK_DEFAULT_QUEUE = env.str("CELERY_QUEUE", "lebureau")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": env.int("CELERY_VISIBILITY_TIMEOUT", 3600)}
CELERY_BEAT_SCHEDULE = {
    "reconcile": {"task": "workers.tasks.reconcile", "schedule": env.float("RECONCILE_INTERVAL", 60.0)},
}

# Agent turns: how long one may run, and after how long without a worker's heartbeat another
# worker picks it up (the turn itself keeps running in the desktop meanwhile).
CHAT_TURN_TIMEOUT = env.int("CHAT_TURN_TIMEOUT", 24 * 3600)
CHAT_STALE_AFTER = env.float("CHAT_STALE_AFTER", 60.0)
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
# Relays: a session token opens a VNC or terminal relay within this many seconds of being minted.
RELAY_TOKEN_MAX_AGE = env.int("RELAY_TOKEN_MAX_AGE", 60)
# What the relays dial inside a desktop.
DESKTOP_VNC_PORT = env.int("DESKTOP_VNC_PORT", 5900)
DESKTOP_SSH_PORT = env.int("DESKTOP_SSH_PORT", 22)
DESKTOP_SSH_USER = env.str("DESKTOP_SSH_USER", "agent")
DEFAULT_PLAN = env.str("DEFAULT_PLAN", "starter")
DEFAULT_IMAGE_PROFILE = env.str("DEFAULT_IMAGE_PROFILE", "full")
# The tier new workspaces go on (each keeps it until support changes it).
DEFAULT_TIER = env.str("DEFAULT_TIER", "free")
# Billing's periodic work: measure every desktop's disk (storage is billed in GiB-hours of those
# measures), then record the workspaces whose spend reached 80 % or 100 % of their cap.
BILLING_METER_INTERVAL = env.float("BILLING_METER_INTERVAL", 600.0)
CELERY_BEAT_SCHEDULE["billing-meter"] = {
    "task": "workers.tasks.billing_meter",
    "schedule": BILLING_METER_INTERVAL,
    "options": {"expires": BILLING_METER_INTERVAL},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", "INFO")},
}
