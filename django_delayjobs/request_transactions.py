"""The request's transactions (``ATOMIC_REQUESTS``), opened where a view can answer them.

Django opens them around a view, before it runs, so a database that cannot be reached
fails as the first one opens: a 500 no view code sees. ``outside_django`` marks a view to
run outside them, and ``opened`` opens the same ones (nested in Django's order) inside
the code that answers a database error: the view keeps the transactions the project
asked for, and their failure to open, or to commit, gets the view's own answer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from django.db import connections, transaction

V = TypeVar("V", bound=Callable[..., Any])


def own_choice(view: Callable[..., Any]) -> frozenset[str]:
    """The aliases ``view`` itself runs outside (``transaction.non_atomic_requests``)."""
    return frozenset(getattr(view, "_non_atomic_requests", ()))


def outside_django(view: V) -> V:
    """Mark ``view`` so that Django opens none of the request's transactions around it (a
    view that only reads, or a wrapper that opens them itself with ``opened``). A new set:
    ``functools.wraps`` shared the wrapped view's, which ``non_atomic_requests`` adds to."""
    view._non_atomic_requests = set(connections.settings)  # type: ignore[attr-defined]
    return view


@contextlib.contextmanager
def opened(own: frozenset[str]) -> Iterator[None]:
    """The transactions Django's ``make_view_atomic`` would open around a view that runs
    outside those of the aliases ``own``."""
    with contextlib.ExitStack() as stack:
        for alias, options in reversed(connections.settings.items()):
            if options.get("ATOMIC_REQUESTS") and alias not in own:
                stack.enter_context(transaction.atomic(using=alias))
        yield
