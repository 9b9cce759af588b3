"""The built-in action that sends a callback job's request.

Registered by the app (``AppConfig.ready``) under ``ACTION``, a fixed name: the worker
runs it like any other registered action. At every attempt it checks everything again
(the row, the destination, the allowlist, every resolved address), because settings and
DNS change while a job waits. A refusal sends nothing and ends the job dead with the rule
that refused it.
"""

from __future__ import annotations

import time
from typing import Any

from ..conf import delayjobs_settings
from ..exceptions import ConfigurationError, GiveUp, InvalidSchedule, Retry
from ..redact import secret_values
from . import config, policy, signing
from .headers import credentials
from .request import InvalidCallback, load, masked

#: The action's registered name: what a callback job's ``action`` column holds.
ACTION = "django_delayjobs.callbacks.deliver"
MISSING_CLIENT = (
    "HTTP callbacks need urllib3, the extra django-delayjobs[http]: pip install urllib3"
)


def shown_kwargs(action: str, kwargs: Any) -> Any:
    """A job's kwargs as the admin and the API show them: a callback's URL (or its
    destination's path) masked as its history lines show it (``?token=***``). The row
    keeps them as they are: they are sent."""
    if action != ACTION or not isinstance(kwargs, dict):
        return kwargs
    return masked(kwargs)


def check_scheduled(action: str, kwargs: Any) -> None:
    """Raise ``InvalidCallback`` if a job of the callback action is given ``kwargs`` that
    no attempt sends, whatever the settings (``schedule(deliver, ...)``, ``build_job``):
    a credential header that job rows must never hold, a malformed request. Such a job
    died at its first attempt; ``schedule_http`` builds what the delivery takes."""
    refused = _unsendable(kwargs) if action == ACTION else None
    if refused is not None:
        raise InvalidCallback(f"{refused}: schedule callbacks with schedule_http", refused.field)


def check_requeue(action: str, kwargs: Any) -> None:
    """Raise ``InvalidCallback`` if ``kwargs`` are a callback's stored request that no
    attempt sends, whatever the settings (a header name refused since it was stored):
    requeued, it would die again at once, and a row's request cannot be edited."""
    if action != ACTION or not isinstance(kwargs, dict):  # a poison row's: its worker says
        return
    refused = _unsendable(kwargs)
    if refused is not None:
        raise InvalidCallback(
            f"its stored request is refused, whatever the settings, so it would die again "
            f"at once, nothing sent: {refused}; schedule a new callback",
            refused.field,
        )


def _unsendable(kwargs: Any) -> InvalidCallback | None:
    """Why the delivery refuses the request ``kwargs`` store whatever the settings (as
    ``load`` reads them at every attempt), or None."""
    try:
        load(kwargs)
    except InvalidCallback as exc:
        return exc
    except InvalidSchedule as exc:  # Refused, for the URL's form
        return InvalidCallback(str(exc), "url")
    return None


def client_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("urllib3") is not None


def require_client() -> None:
    """Raise ``ConfigurationError`` when the HTTP client is not installed."""
    if not client_installed():
        raise ConfigurationError(MISSING_CLIENT)


def deliver(**stored: Any) -> dict[str, Any]:
    """Send the stored request once; return the answer's summary, or raise ``Retry`` or
    ``GiveUp``."""
    from ..execution import current_job, note
    from ..outcomes import backoff_seconds

    job = current_job.get()
    if job is None:
        raise RuntimeError("deliver runs as a job's action, inside a worker")
    try:
        from . import delivery, outcome  # urllib3: the optional "http" extra
    except ImportError as exc:
        raise GiveUp(f"{MISSING_CLIENT} ({exc})") from None
    settings = delayjobs_settings
    http = config.current()
    started = time.monotonic()  # HTTP_TIMEOUT_SECONDS bounds the lookup too
    try:
        request = load(stored)
        target, destination = request.target(http)
        lookup = min(http.resolve_timeout, settings.HTTP_TIMEOUT_SECONDS)
        addresses = policy.addresses(target, http.allow_private, lookup)
    except policy.Refused as exc:
        raise GiveUp(f"refused, nothing sent: {exc} [rule: {exc.rule}]") from None
    except InvalidCallback as exc:
        raise GiveUp(f"refused, nothing sent: {exc}") from None
    except OSError as exc:  # the name did not resolve: perhaps a passing DNS failure
        raise Retry(
            f"{request.method} {request.where} -> {target.host} did not resolve: {exc}"
        ) from None
    body = request.body_bytes()
    headers = request.send_headers(destination)
    # A receiver may quote the URL it was asked for: its ?token= is masked there too.
    sent_credentials = credentials(headers, also=secret_values(target.target))
    headers.update(signing.sign(str(job.pk), body, http.secrets_for(destination), int(time.time())))
    limits = delivery.Limits(
        connect=settings.HTTP_CONNECT_TIMEOUT_SECONDS,
        read=settings.HTTP_READ_TIMEOUT_SECONDS,
        total=settings.HTTP_TIMEOUT_SECONDS,
        keep_bytes=settings.HTTP_RESPONSE_KEEP_BYTES,
        ca_file=settings.HTTP_CA_BUNDLE,
    )
    try:
        response = delivery.send(target, addresses, request.method, headers, body, limits,
                                 started=started)  # fmt: skip
    except delivery.DeliveryFailed as exc:
        raise outcome.failed(request.method, request.where, exc, sent_credentials) from None
    response = outcome.without_credentials(response, sent_credentials)
    result = outcome.judge(
        request.method,
        request.where,
        response,
        retry_statuses=settings.HTTP_RETRY_STATUSES,
        retry_after_max=settings.HTTP_RETRY_AFTER_MAX_SECONDS,
        backoff=backoff_seconds(job.attempts),
    )  # a failure's Retry/GiveUp message is its history line; a success notes its own
    note(outcome.line(request.method, request.where, response))
    return result


deliver.delayable_name = ACTION  # type: ignore[attr-defined]


def register() -> None:
    """Make ``deliver`` a registered action (``AppConfig.ready`` calls this)."""
    from ..registry import register as register_action

    # Not atomic: the request must not hold a database transaction open while it waits
    # for the receiver (on SQLite that would be the write lock).
    register_action(ACTION, deliver, atomic=False)
