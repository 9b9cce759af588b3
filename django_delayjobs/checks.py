"""System checks for the ``DELAYJOBS`` settings: clear messages instead of odd failures.

Types and bounds come from the one schema in ``conf.py``; this module only turns its
problems into check messages and adds the checks that need the rest of Django.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from .conf import DEFAULTS, NAMES, Problem, Settings, describe, validate
from .connection import cluster_url_problem, redis_url_problem

#: Check id of each kind of problem (ids are stable: users silence them by id).
_IDS = {
    "dict": 1, "unknown": 2, "float": 3, "int": 4, "name": 5, "type": 6, "permissions": 8,
    "http": 9, "shards": 12,
}  # fmt: skip


def _error(msg: str, hint: str, n: int) -> Error:
    return Error(msg, hint=hint, id=f"django_delayjobs.E{n:03d}")


def _as_error(problem: Problem) -> Error:
    if problem.kind == "unknown":
        return _error(
            f"DELAYJOBS has an unknown setting {problem.name!r}.",
            f"Known settings: {', '.join(sorted(NAMES))}.",
            _IDS["unknown"],
        )
    default = DEFAULTS.get(problem.name or "")
    hint = f"The default is {default!r}." if problem.name else "DELAYJOBS = {'REDIS_URL': ...}"
    return _error(describe(problem) + ".", hint, _IDS[problem.kind])


@register(Tags.compatibility)
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[Error | Warning]:
    """Report unknown names and bad values in ``settings.DELAYJOBS``."""
    user = getattr(settings, "DELAYJOBS", None)
    loaded, problems = validate(user)
    errors: list[Error | Warning] = [_as_error(p) for p in problems]
    if not isinstance(user, dict):
        return errors
    alias = user.get("CACHE_ALIAS")
    if isinstance(alias, str) and alias not in settings.CACHES:
        errors.append(_error(f"DELAYJOBS['CACHE_ALIAS'] = {alias!r} is not in CACHES.",
                             f"Known caches: {', '.join(settings.CACHES)}.", 7))  # fmt: skip
    if loaded is not None and loaded.REDIS_CLUSTER and not loaded.CACHE_ALIAS:
        problem = cluster_url_problem(loaded.REDIS_URL)
        if problem:
            errors.append(
                _error(
                    f"DELAYJOBS['REDIS_URL'] {problem}.",
                    "REDIS_CLUSTER needs redis://host:port (or rediss://) of any node, database 0.",
                    13,
                )
            )
    elif loaded is not None and not loaded.CACHE_ALIAS:
        problem = redis_url_problem(loaded.REDIS_URL)
        if problem:
            errors.append(_error(
                f"DELAYJOBS['REDIS_URL'] {problem}.",
                "Give redis://host:port/db, rediss://... or unix:///path/to/socket.",
                16,
            ))  # fmt: skip
    if loaded is not None and loaded.RECONCILE_HORIZON_SECONDS < loaded.RECONCILE_SECONDS:
        errors.append(Warning(
            "DELAYJOBS['RECONCILE_HORIZON_SECONDS'] is shorter than RECONCILE_SECONDS: a job "
            "lost by Redis may then run up to RECONCILE_SECONDS late.",
            hint="Make the horizon at least as long as the sweep interval.",
            id="django_delayjobs.W001",
        ))  # fmt: skip
    if loaded is not None:
        errors += [*_http_checks(loaded), *_timeless_cache(loaded)]
        if not loaded.API_CALLBACK_PERMISSIONS and _callbacks_let_anyone_in():
            errors.append(Warning(
                "DELAYJOBS['API_CALLBACK_PERMISSIONS'] is empty and API_PERMISSION_CLASSES "
                "let anonymous users in: anyone may have this site send HTTP callbacks, and "
                "cancel or move any caller's callback by its key, through callbacks/.",
                hint="List the permissions a caller needs in API_CALLBACK_PERMISSIONS (the "
                "default is ['django_delayjobs.add_job']), or require a login in "
                "API_PERMISSION_CLASSES.",
                id="django_delayjobs.W003",
            ))  # fmt: skip
    return errors


def _timeless_cache(loaded: Settings) -> list[Warning]:
    """W005: the ``CACHE_ALIAS`` cache's client has no socket timeout. The worker, the
    health check and ``delayjobs_stats`` refuse it; a web process has no start-up of its
    own, and its ``schedule()``, admin, API and metrics would wait for good on a Redis
    that stops answering. Built, not connected; a cache that gives no client is left to
    the checks and errors that say so."""
    if not loaded.CACHE_ALIAS or loaded.CACHE_ALIAS not in settings.CACHES:
        return []
    from .connection import cache_client
    from .engine.waiting import socket_timeout

    try:
        client = cache_client(loaded.CACHE_ALIAS)
    except Exception:  # not django-redis, a Cluster mismatch: said at first use
        return []
    if socket_timeout(client) is not None:
        return []
    return [Warning(
        f"The Redis client of DELAYJOBS['CACHE_ALIAS'] = {loaded.CACHE_ALIAS!r} has no socket "
        "timeout: the worker refuses it, and a web process would wait for good on a Redis "
        "that stops answering (in schedule(), the admin, the API, the metrics).",
        hint="Give the cache one, 1 to 5 s: SOCKET_TIMEOUT in its OPTIONS, or socket_timeout "
        "in its CONNECTION_POOL_KWARGS.",
        id="django_delayjobs.W005",
    )]  # fmt: skip


def _callbacks_let_anyone_in() -> bool:
    """Whether ``callbacks/`` lets an anonymous POST in: asked of its own permissions, so
    that any class (``AllowAny``, ``A | B``, a project's own) is judged by what it does."""
    from django.http import HttpRequest
    from rest_framework.request import Request

    from .rest.callbacks import CallbackCreateView

    http = HttpRequest()
    http.method = "POST"
    view = CallbackCreateView()
    view.request = request = Request(http)  # no authenticators: an anonymous user
    try:
        return all(p.has_permission(request, view) for p in view.get_permissions())
    except Exception:  # a class that fails for this request refuses it (with a 500)
        return False


@register(Tags.security, deploy=True)
def check_callback_queues(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[Error | Warning]:
    """Warn, on ``check --deploy``, of a routed ``callbacks/`` whose callers may name any
    queue: a deploy check, since every command runs the others (the worker's start-up)."""
    loaded, _ = validate(getattr(settings, "DELAYJOBS", None))
    if loaded is None or loaded.API_CALLBACK_QUEUES is not None or not _callbacks_routed():
        return []
    return [Warning(
        "DELAYJOBS['API_CALLBACK_QUEUES'] is None: a callbacks/ caller may put its callbacks "
        "in any queue, and a key is held per queue whoever made the job, so a caller's "
        "callback holding a key in your queue makes your schedule(..., key=...) of that key "
        "return the callback, and your job is never scheduled.",
        hint="List the queues callers may use in API_CALLBACK_QUEUES (for example "
        "['callbacks']), queues your own keyed jobs do not use, and run a worker for them.",
        id="django_delayjobs.W004",
    )]  # fmt: skip


def _callbacks_routed() -> bool:
    """Whether the project's URLconf routes to ``callbacks/`` (``django_delayjobs.rest.urls``
    included, under any prefix or namespace)."""
    from django.urls import URLResolver, get_resolver

    from .rest.callbacks import CallbackCreateView

    def routes(patterns: Sequence[Any]) -> bool:
        return any(
            routes(p.url_patterns) if isinstance(p, URLResolver)
            else issubclass(getattr(p.callback, "view_class", object), CallbackCreateView)
            for p in patterns
        )  # fmt: skip

    try:
        return routes(get_resolver().url_patterns)
    except Exception:  # a URLconf that fails to load: Django's own check (urls) reports it
        return False


#: Why ``USE_TZ = False`` is refused (check E015, and ``schedule()`` at run time).
NEEDS_USE_TZ = (
    "django-delayjobs needs USE_TZ = True: due times are instants (Redis holds them as ms "
    "since the epoch) and are computed, stored and compared as aware datetimes"
)


@register(Tags.compatibility)
def check_use_tz(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[Error | Warning]:
    """Refuse ``USE_TZ = False``: the app would fail at its first ``schedule()``."""
    if settings.USE_TZ:
        return []
    return [
        _error(
            f"{NEEDS_USE_TZ}; this project sets USE_TZ = False.",
            "Set USE_TZ = True in your settings (Django's default since 5.0).",
            15,
        )
    ]


def _http_checks(loaded: Settings) -> list[Error | Warning]:
    """What the ``HTTP_*`` settings get wrong together (each is valid alone)."""
    from .callbacks.action import MISSING_CLIENT, client_installed
    from .callbacks.config import HttpConfig, problems

    found: list[Error | Warning] = [
        _error(f"DELAYJOBS: {problem}.", "Add the host to HTTP_ALLOWED_HOSTS.", 10)
        for problem in problems(loaded)
    ]
    config = HttpConfig.of(loaded)
    if (config.allowed or config.destinations) and not client_installed():
        found.append(_error(f"DELAYJOBS: {MISSING_CLIENT}.", "HTTP callbacks are configured.", 11))
    bundle = loaded.HTTP_CA_BUNDLE
    if bundle is not None:
        import ssl

        try:
            ssl.create_default_context(cafile=bundle)
        except OSError as exc:  # missing, unreadable, or not PEM (ssl.SSLError)
            found.append(_error(
                f"DELAYJOBS['HTTP_CA_BUNDLE'] = {bundle!r} cannot be loaded: {exc}.",
                "Give the path of a readable PEM file of CA certificates, or None for the "
                "system's trust store: every HTTPS callback fails (TLS) until then.",
                14,
            ))  # fmt: skip
    unsigned = [d.name for d in config.destinations.values() if not config.secrets_for(d)]
    if config.allowed and not config.secrets:
        unsigned.insert(0, "URLs")
    if unsigned:
        found.append(Warning(
            f"DELAYJOBS: HTTP callbacks to {', '.join(unsigned)} are sent unsigned: their "
            "receivers cannot tell them from forgeries.",
            hint="Set HTTP_SIGNING_SECRETS (generate one with "
            "django_delayjobs.callbacks.signing.new_secret()).",
            id="django_delayjobs.W002",
        ))  # fmt: skip
    return found
