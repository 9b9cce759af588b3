"""``manage.py embedded_redis``: run the shop's private Redis in the foreground.

The settings point at its unix socket (``var/redis/redis.sock``) when ``REDIS_URL`` is not
set, so ``runserver`` and ``run_delayworker`` started in other terminals share it. Ctrl-C
(or SIGTERM) stops the server, by its pid.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.redact import without_userinfo
from shop.simulation import redis_answers


class Command(BaseCommand):
    help = "Run a private redis-server for the example shop until Ctrl-C."

    def handle(self, *args: Any, **options: Any) -> None:
        if os.environ.get("REDIS_URL"):
            raise CommandError(
                f"REDIS_URL is set ({without_userinfo(os.environ['REDIS_URL'])}): the shop "
                "uses that Redis, so there is no need for an embedded one"
            )
        try:
            server = EmbeddedRedis(settings.EMBEDDED_REDIS_DIR)
        except ValueError as exc:  # a clone so deep that var/redis/redis.sock is too long
            raise CommandError(f"{exc}; or set REDIS_URL") from exc
        if redis_answers(server.url):
            raise CommandError(f"a Redis already answers at {server.url}")
        stop = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda *_: stop.set())
        try:
            try:
                url = server.start()
            except (OSError, RuntimeError) as exc:  # no redis-server, or it did not start
                raise CommandError(str(exc)) from exc
            self.stdout.write(f"embedded Redis (pid {server.pid}) at {url}; Ctrl-C stops it")
            while not stop.wait(1.0):
                if server.process is None or server.process.poll() is not None:
                    raise CommandError(
                        "redis-server exited; see its log in " + str(server.directory)
                    )
        finally:
            server.stop()
        self.stdout.write("embedded Redis stopped")
