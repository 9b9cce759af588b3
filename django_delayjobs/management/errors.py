"""The one line a command says for a database error."""

from __future__ import annotations

import contextlib

from django.db import Error as DatabaseError


def database_error(exc: DatabaseError) -> str:
    """The one line for a database error: a database that ``migrate`` has not brought up
    to this version answers, yet refuses (``no such table``, ``no such column``), and is
    said so; the app's own migrations are named first, else any other app's (a model
    that refers to ``Job``, whose table the prune reads)."""
    from django.db import connections
    from django.db.migrations.executor import MigrationExecutor

    from ..models import Deployment

    connection, plan = connections[Deployment.objects.db], []
    if connection.connection is not None:  # it answered (no second wait for one that did not)
        with contextlib.suppress(Exception):  # a project's migrations that do not load
            executor = MigrationExecutor(connection)
            plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    missing = [m for m, backwards in plan if not backwards]
    ours = [m.name for m in missing if m.app_label == "django_delayjobs"]
    if ours:
        return (f"the database lacks {len(ours)} migration(s) of django_delayjobs "
                f"({ours[0]} to {ours[-1]}): run manage.py migrate ({exc})")  # fmt: skip
    if missing:
        names = ", ".join(f"{m.app_label}.{m.name}" for m in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return (f"the database lacks {len(missing)} migration(s) ({names}{more}): "
                f"run manage.py migrate ({exc})")  # fmt: skip
    return f"the database is unavailable: {exc}"
