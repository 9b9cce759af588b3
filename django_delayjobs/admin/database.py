"""A clear 503, not a 500 with a traceback, when the jobs' database cannot be reached.

The jobs may live on a database of their own (a router sends them there) while the
project's, with its users and sessions, answers: the admin then still lets staff in, and
every job page failed on its first query. A view that fails with a connection error asks
the health check's bounded probe whether the jobs' database answers; if it does not, the
page says which alias is down and why (the error is logged in full), and if it does, the
error is not about it and is raised as it was.

With ``ATOMIC_REQUESTS`` the guard opens the request's transactions itself (see
``request_transactions``), so a failure to open them is answered like the rest.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

from django.db import InterfaceError, OperationalError, connections
from django.http import HttpRequest, HttpResponse
from django.template.response import SimpleTemplateResponse, TemplateResponse
from django.utils.translation import gettext as _

from .. import request_transactions, sql
from ..health import check_database

logger = logging.getLogger("django_delayjobs")

View = Callable[..., HttpResponse]


def guarded(view: View, context: Callable[[HttpRequest], dict[str, Any]]) -> View:
    """``view``, answering 503 when the jobs' database cannot be reached. ``context``:
    the admin site's context of a page (its header and links)."""

    own = request_transactions.own_choice(view)

    @functools.wraps(view)
    def run(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        try:
            with request_transactions.opened(own):
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

    return request_transactions.outside_django(run)
