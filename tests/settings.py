"""Settings for the test suite: SQLite by default, PostgreSQL when DATABASE_URL is set.

The Redis URL is filled in by ``conftest.py`` (REDIS_URL, or a private server it starts).
"""

import json
import os
import tempfile
from typing import Any

import dj_database_url

SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_delayjobs",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
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

STATIC_URL = "/static/"

# A user made with the default hasher costs a third of a second of PBKDF2 (more on a busy
# machine), and hundreds of tests make one: no test is about password strength.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": dj_database_url.parse(os.environ["DATABASE_URL"])}
    if os.environ.get("DELAYJOBS_TEST_DB_NAME"):  # a worker process started by a test
        DATABASES["default"]["NAME"] = os.environ["DELAYJOBS_TEST_DB_NAME"]
    if os.environ.get("DELAYJOBS_TEST_PERSISTENT_CONNECTIONS"):  # a worker that keeps them
        DATABASES["default"]["CONN_MAX_AGE"] = None
    # Which process a session is, in pg_stat_activity (see conftest's django_db_setup).
    DATABASES["default"].setdefault("OPTIONS", {})["application_name"] = (
        f"delayjobs-tests pid {os.getpid()}"
    )
    # More OPTIONS, as JSON: .ci/run's second PostgreSQL pass uses server-side binding with
    # prepared statements ({"server_side_binding": true, "prepare_threshold": 5}).
    DATABASES["default"]["OPTIONS"].update(
        json.loads(os.environ.get("DELAYJOBS_TEST_DATABASE_OPTIONS", "{}"))
    )
else:
    # A file, not :memory:, so worker processes started by tests share the database.
    _db = os.environ.get("DELAYJOBS_TEST_SQLITE") or os.path.join(
        tempfile.gettempdir(), f"delayjobs-tests-{os.getpid()}.sqlite3"
    )
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": _db,
            "TEST": {"NAME": _db},
            "OPTIONS": {
                "timeout": float(os.environ.get("DELAYJOBS_SQLITE_TIMEOUT", 30)),
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

if os.environ.get("DELAYJOBS_TEST_REPLICA"):  # tests/test_routers.py: reads go to a replica
    DATABASES["replica"] = {"ENGINE": "django.db.backends.sqlite3",
                            "NAME": os.environ["DELAYJOBS_TEST_REPLICA"]}  # fmt: skip

    class PrimaryReplica:
        """Django's documented primary/replica router: every read goes to the replica."""

        def db_for_read(self, model: object, **hints: object) -> str:
            return "replica"

        def db_for_write(self, model: object, **hints: object) -> str:
            return "default"

        def allow_relation(self, obj1: object, obj2: object, **hints: object) -> bool:
            return True

    DATABASE_ROUTERS: list[object] = [PrimaryReplica()]

if os.environ.get("DELAYJOBS_TEST_JOBS_DB"):  # tests/test_audit_tsk3.py: Job on a database
    DATABASES["jobs"] = {"ENGINE": "django.db.backends.sqlite3",  # of its own
                         "NAME": os.environ["DELAYJOBS_TEST_JOBS_DB"]}  # fmt: skip

    class JobsApart:
        """delayjobs' tables on "jobs" (content types on both, as its foreign key needs)."""

        def db_for_write(self, model: Any, **hints: object) -> str | None:
            return "jobs" if model._meta.app_label == "django_delayjobs" else None

        db_for_read = db_for_write

        def allow_relation(self, obj1: object, obj2: object, **hints: object) -> bool:
            return True

        def allow_migrate(self, db: str, app_label: str, **hints: object) -> bool:
            if app_label in ("django_delayjobs", "contenttypes"):
                return app_label == "contenttypes" or db == "jobs"
            return db == "default"

    DATABASE_ROUTERS = [JobsApart()]

if os.environ.get("DELAYJOBS_TEST_THINGS_DB"):  # tests/test_audit_lead.py: the test app's
    DATABASES["things"] = {"ENGINE": "django.db.backends.sqlite3",  # Thing rows elsewhere
                           "NAME": os.environ["DELAYJOBS_TEST_THINGS_DB"]}  # fmt: skip

    class ThingsApart:
        def db_for_write(self, model: Any, **hints: object) -> str | None:
            return "things" if model._meta.label == "testapp.Thing" else None

        db_for_read = db_for_write

    DATABASE_ROUTERS = [ThingsApart()]

DELAYJOBS = {
    "REDIS_URL": os.environ.get("REDIS_URL", "redis://localhost:6379/0"),
    "LEASE_SECONDS": float(os.environ.get("DELAYJOBS_LEASE_SECONDS", 300)),
    "RETRY_BACKOFF_SECONDS": float(os.environ.get("DELAYJOBS_RETRY_BACKOFF_SECONDS", 10)),
    "RECONCILE_SECONDS": float(os.environ.get("DELAYJOBS_RECONCILE_SECONDS", 60)),
    "HEARTBEAT_SECONDS": float(os.environ.get("DELAYJOBS_HEARTBEAT_SECONDS", 10)),
    "MAX_DELIVERIES": int(os.environ.get("DELAYJOBS_MAX_DELIVERIES", 3)),
    # HTTP callback settings of a worker process started by a test (a JSON object).
    **json.loads(os.environ.get("DELAYJOBS_TEST_HTTP", "{}")),
    # Worker processes started by cluster tests (tests/conftest.py, worker_redis).
    "REDIS_CLUSTER": os.environ.get("DELAYJOBS_TEST_REDIS_CLUSTER") == "1",
    "QUEUE_SHARDS": json.loads(os.environ.get("DELAYJOBS_TEST_QUEUE_SHARDS") or "{}"),
}
# A worker started by a retention or MAX_RUN_SECONDS test.
for _name in ("PRUNE_AFTER_SECONDS", "MAX_RUN_SECONDS", "SHUTDOWN_GRACE_SECONDS"):
    if os.environ.get(f"DELAYJOBS_{_name}"):
        DELAYJOBS[_name] = float(os.environ[f"DELAYJOBS_{_name}"])
if os.environ.get("DELAYJOBS_TEST_LEASE_FRACTION"):  # a worker started by test_audit_lse.py
    # The fraction of a ms its leases end in, chosen by the test (a multiple of 1/4096, as
    # repr writes it): two picked at random are the same one time in 4095, and two holders
    # that share one take each other's leases for their own (engine/leases.py).
    from django_delayjobs.engine import leases as _leases

    _leases.fraction = lambda: os.environ["DELAYJOBS_TEST_LEASE_FRACTION"]
if os.environ.get("DELAYJOBS_METRICS_TOKEN"):  # a worker started by a metrics test
    DELAYJOBS["METRICS_TOKEN"] = os.environ["DELAYJOBS_METRICS_TOKEN"]
    DELAYJOBS["METRICS_ACTIONS"] = json.loads(os.environ.get("DELAYJOBS_METRICS_ACTIONS", "[]"))

TASKS = {
    "default": {
        "BACKEND": "django_delayjobs.backends.DelayJobsBackend",
        "QUEUES": ["default", "other"],
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"django_delayjobs": {"handlers": ["console"], "level": "INFO"}},
}
