"""A clear 503, not a 500 with a traceback, when the jobs' database cannot be reached.

The jobs may live on a database of their own (a router sends them there) while the
project's, with its users and sessions, answers: the admin then still lets staff in, and
every job page failed on its first query. A view that fails with a connection error asks
the health check's bounded probe whether the jobs' database answers; if it does not, the
page says which alias is down and why (the error is logged in full), and if it does, the
error is not about it and is raised as it was.

With ``ATOMIC_REQUESTS`` Django opens the request's transactions around the view, so
their first query (which fails) ran before the guard. The guarded view is marked to run
outside them and opens the same ones itself, inside the guard: the views keep the
transactions the project asked for, and their failure to open is answered like the rest.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any

from django.db import InterfaceError, OperationalError, connections, transaction
from django.http import HttpRequest, HttpResponse
from django.template.response import SimpleTemplateResponse, TemplateResponse
from django.utils.translation import gettext as _

from .. import sql
from ..health import check_database

logger = logging.getLogger("django_delayjobs")

View = Callable[..., HttpResponse]


def guarded(view: View, context: Callable[[HttpRequest], dict[str, Any]]) -> View:
    """``view``, answering 503 when the jobs' database cannot be reached. ``context``:
    the admin site's context of a page (its header and links)."""

    own = frozenset(getattr(view, "_non_atomic_requests", ()))  # the view's own choice

    @functools.wraps(view)
    def run(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            with _request_transactions(own):
                response = view(request, *args, **kwargs)
                # Rendered here: a page's querysets run while it renders.
                if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
                    response.render()
            return response
        except (OperationalError, InterfaceError):
            probe = check_database()
            if probe.ok:
                raise
            alias = sql.db()
            logger.exception("The jobs database %r cannot be reached", alias)
            page = {
                **context(request),
                "title": _("The jobs database cannot be reached"),
                "alias": alias,
                "vendor": connections[alias].display_name,
                "detail": probe.detail,
            }
            return TemplateResponse(
                request, "admin/django_delayjobs/database_error.html", page, status=503
            ).render()

    # Django opens none around ``run`` (a new set: wraps() shared the view's).
    run._non_atomic_requests = set(connections.settings)  # type: ignore[attr-defined]
    return run


@contextlib.contextmanager
def _request_transactions(own: frozenset[str]) -> Iterator[None]:
    """The transactions Django's ``make_view_atomic`` would open around a view that runs
    outside those of the aliases ``own``, nested in the same order."""
    with contextlib.ExitStack() as stack:
        for alias, options in reversed(connections.settings.items()):
            if options.get("ATOMIC_REQUESTS") and alias not in own:
                stack.enter_context(transaction.atomic(using=alias))
        yield
