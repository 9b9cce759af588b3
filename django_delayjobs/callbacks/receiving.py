"""The receiving side in Django: a view decorator (and a helper) that accepts a request
only if its Standard Webhooks signature and timestamp check out.

A callback carries no session and no CSRF token: its signature is its authentication, so
the decorated view is CSRF-exempt, needs no login (``LoginRequiredMiddleware``), and
answers 401 to anything that does not verify. Receivers should also treat
``request.webhook_id`` as an idempotency key: a callback is delivered at least once, and
a retry carries the same id.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast, overload

from django.contrib.auth.decorators import login_not_required
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from .signing import InvalidSignature, require_list, verify

View = TypeVar("View", bound=Callable[..., Any])
Secrets = Sequence[str] | Callable[[], Sequence[str]] | None


def _secrets(secrets: Secrets) -> Sequence[str]:
    if secrets is None:
        from ..conf import delayjobs_settings

        return delayjobs_settings.HTTP_SIGNING_SECRETS
    return secrets() if callable(secrets) else secrets


def verify_request(
    request: HttpRequest, *, secrets: Secrets = None, tolerance: float | None = None
) -> str:
    """Return the request's ``webhook-id`` if its signature verifies; else raise
    ``InvalidSignature``. ``secrets`` default to ``HTTP_SIGNING_SECRETS``."""
    if tolerance is None:
        from ..conf import delayjobs_settings

        tolerance = delayjobs_settings.HTTP_SIGNATURE_TOLERANCE_SECONDS
    return verify(request.headers, request.body, _secrets(secrets), tolerance=tolerance)


def _refusal(exc: InvalidSignature) -> HttpResponse:
    return HttpResponse(
        f"webhook signature refused: {exc}\n", status=401, content_type="text/plain"
    )


def exempt(view: Callable[..., Any]) -> Callable[..., Any]:
    """The signature is the request's authentication, and its CSRF protection: the sender
    has no session (``LoginRequiredMiddleware`` would send it to the login page)."""
    return login_not_required(csrf_exempt(view))


@overload
def verify_webhook(view: View) -> View: ...
@overload
def verify_webhook(
    view: None = None, *, secrets: Secrets = None, tolerance: float | None = None
) -> Callable[[View], View]: ...
def verify_webhook(
    view: View | None = None, *, secrets: Secrets = None, tolerance: float | None = None
) -> Any:
    """Decorate a view that receives callbacks: 401 unless the signature verifies; the
    view sees ``request.webhook_id``. Use bare or with ``secrets=``/``tolerance=``."""
    if not callable(secrets) and secrets is not None:
        require_list(secrets)  # said now, not as a 500 at every request

    def decorate(view: View) -> View:
        if inspect.iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                try:
                    request.webhook_id = verify_request(  # type: ignore[attr-defined]
                        request, secrets=secrets, tolerance=tolerance
                    )
                except InvalidSignature as exc:
                    return _refusal(exc)
                return await view(request, *args, **kwargs)

            return cast(View, exempt(async_wrapper))

        @functools.wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            try:
                request.webhook_id = verify_request(  # type: ignore[attr-defined]
                    request, secrets=secrets, tolerance=tolerance
                )
            except InvalidSignature as exc:
                return _refusal(exc)
            return view(request, *args, **kwargs)

        return cast(View, exempt(wrapper))

    return decorate if view is None else decorate(view)
