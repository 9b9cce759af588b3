"""Django settings for the delayjobs side of ``bench/compare.py`` (env-driven)."""

import json
import os

SECRET_KEY = "bench-only"
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "rest_framework",
    "django_delayjobs",
    "peers.djapp",
]
if os.environ.get("BENCH_DATABASE_URL"):
    import dj_database_url

    DATABASES = {"default": dj_database_url.parse(os.environ["BENCH_DATABASE_URL"])}
    # More OPTIONS for that database, as JSON (docs/performance.md: server-side binding).
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        json.loads(os.environ.get("BENCH_DATABASE_OPTIONS", "{}"))
    )
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("BENCH_SQLITE_PATH", "bench.sqlite3"),
            # WAL with synchronous=NORMAL: a commit does not fsync (a power cut may lose
            # the last commits; a crash of the process does not). docs/performance.md.
            "OPTIONS": {
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
DELAYJOBS = {
    "REDIS_URL": os.environ.get("BENCH_REDIS_URL", "unix:///nonexistent"),
    # More settings for one benchmark (bench/callbacks.py: its HTTP_* settings), as JSON.
    **json.loads(os.environ.get("BENCH_DELAYJOBS", "{}")),
}
