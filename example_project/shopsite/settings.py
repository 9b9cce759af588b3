"""Settings of the example shop.

Zero configuration: a SQLite file in ``example_project/var/`` and the Redis of
``manage.py embedded_redis`` (a private ``redis-server`` on a unix socket in ``var/``).
The ``demo`` command needs neither: it migrates, and starts (and stops) its own private
Redis unless ``REDIS_URL`` is set. Nothing here starts a process.

Environment:

- ``DATABASE_URL``: use this database instead of SQLite (needs ``dj-database-url``, in
  the ``dev`` extra), e.g. ``postgres://user@localhost:5432/shop``.
- ``SHOP_SQLITE_PATH``: another SQLite file (the tests use a temporary one).
- ``REDIS_URL``: use this Redis instead of the embedded one.
- ``SHOP_AUTO_CANCEL_SECONDS``: how long an order may stay unpaid (default 1800).
- ``SHOP_BASE_URL``: where this shop answers, for its own payment-reminder callbacks
  (default ``http://127.0.0.1:8000``, ``runserver``'s address; ``demo`` sets its own).
- ``SHOP_WEBHOOK_SECRET``: the ``whsec_...`` secret that signs and verifies them.
- ``SHOP_SECRET_KEY``, ``SHOP_DEBUG`` (``0`` or ``1``, default 1), ``SHOP_ALLOWED_HOSTS``
  (comma-separated): for running it behind gunicorn (``deploy/``). With ``SHOP_DEBUG=0``,
  ``SHOP_SECRET_KEY`` and ``SHOP_WEBHOOK_SECRET`` must be set.
"""

import os
from pathlib import Path
from urllib.parse import quote, urlsplit

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent  # example_project/
VAR_DIR = BASE_DIR / "var"  # gitignored: the SQLite file, the embedded Redis, logs

SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "example-shop-not-secret")
DEBUG = os.environ.get("SHOP_DEBUG", "1") == "1"
if not DEBUG:  # deployed: the defaults of these two are published in this file
    for _name in ("SHOP_SECRET_KEY", "SHOP_WEBHOOK_SECRET"):
        if not os.environ.get(_name):
            raise ImproperlyConfigured(
                f"{_name} must be set when SHOP_DEBUG=0: its default, in the shop's source, "
                "would let anyone sign what the shop trusts"
            )
ALLOWED_HOSTS = os.environ.get("SHOP_ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_delayjobs",
    "shop",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "shopsite.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

if os.environ.get("DATABASE_URL"):
    try:
        import dj_database_url
    except ImportError as exc:  # pragma: no cover - the dev extra has it
        raise ImproperlyConfigured(
            "DATABASE_URL is set but dj-database-url is not installed: "
            "pip install dj-database-url (it is in the extra django-delayjobs[dev])"
        ) from exc
    DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"])}
else:
    _sqlite = Path(os.environ.get("SHOP_SQLITE_PATH") or VAR_DIR / "shop.sqlite3")
    _sqlite.parent.mkdir(parents=True, exist_ok=True)
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": _sqlite,
            "OPTIONS": {
                # Web process, demo and worker share the file. IMMEDIATE takes the write
                # lock when a transaction begins, so concurrent transactions queue up
                # (SQLite ignores select_for_update) instead of failing half-way.
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

#: Where ``manage.py embedded_redis`` puts its server (and its unix socket).
EMBEDDED_REDIS_DIR = VAR_DIR / "redis"

#: Where this shop answers HTTP (its payment reminders are callbacks to itself).
SHOP_BASE_URL = os.environ.get("SHOP_BASE_URL", "http://127.0.0.1:8000")


def shop_delayjobs(base_url: str) -> dict[str, object]:
    """The DELAYJOBS settings, with the shop's own address as the ``shop`` destination."""
    # Quoted, as EmbeddedRedis.url is: in a clone under ~/c#/ a "#" starts no fragment.
    socket = quote(str(EMBEDDED_REDIS_DIR / "redis.sock"))
    return {
        "REDIS_URL": os.environ.get("REDIS_URL") or f"unix://{socket}",
        # Callbacks go only to the shop itself. It is on this machine (127.0.0.1), a
        # private address, which a production site would not allow.
        "HTTP_DESTINATIONS": {"shop": {"url": base_url}},
        "HTTP_ALLOWED_HOSTS": [urlsplit(base_url).netloc],
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,
        # A demo secret; a real site keeps its own out of the code (new_secret() makes one).
        "HTTP_SIGNING_SECRETS": [
            os.environ.get(
                "SHOP_WEBHOOK_SECRET", "whsec_ZXhhbXBsZS1zaG9wLW5vdC1hLXJlYWwtc2VjcmV0IQ=="
            )
        ],
    }


DELAYJOBS = shop_delayjobs(SHOP_BASE_URL)

#: An order not paid within this many seconds is cancelled.
SHOP_AUTO_CANCEL_SECONDS = float(os.environ.get("SHOP_AUTO_CANCEL_SECONDS", 1800))
if not 0 <= SHOP_AUTO_CANCEL_SECONDS < 10**9:  # NaN, inf or negative: no order could be placed
    raise ImproperlyConfigured(
        f"SHOP_AUTO_CANCEL_SECONDS must be a number of seconds from 0 to 10**9, "
        f"not {os.environ['SHOP_AUTO_CANCEL_SECONDS']!r}"
    )

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_delayjobs": {"handlers": ["console"], "level": "WARNING"}},
}
