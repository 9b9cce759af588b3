"""Naming the jobs' database, and the one line for a database error (commands, the
worker's outage lines, the API's 503)."""

from __future__ import annotations

import contextlib

from django.db import router
from django.db.models import Model


def jobs_alias(model: type[Model] | None = None) -> str | None:
    """The alias of the database that holds ``model``'s rows (``Job`` by default), or None
    when its reads and writes are routed apart (an error may then be either's)."""
    from .models import Job

    model = model or Job
    alias = router.db_for_write(model)
    return alias if router.db_for_read(model) == alias else None


def database_named(alias: str | None) -> str:
    """How a line names the database: the jobs' by its alias, when known (see
    ``jobs_alias``)."""
    return "the database" if alias is None else f"the jobs database {alias!r}"


def database_error(exc: BaseException | str, alias: str | None = None) -> str:
    """The one line for a database error; ``alias``: the jobs' database, where the error
    is known to be its (named, as the admin's page names it: the jobs may live on a
    database of their own, down while the project's answers). A database that ``migrate``
    has not brought up to this version answers, yet refuses (``no such table``, ``no such
    column``), and is said so; the app's own migrations are named first, else any other
    app's (a model that refers to ``Job``, whose table the prune reads)."""
    from django.db import connections
    from django.db.migrations.executor import MigrationExecutor

    from .models import Deployment

    connection, plan = connections[alias or Deployment.objects.db], []
    if connection.connection is not None:  # it answered (no second wait for one that did not)
        with contextlib.suppress(Exception):  # a project's migrations that do not load
            executor = MigrationExecutor(connection)
            plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    where = database_named(alias)
    migrate = "manage.py migrate" + ("" if alias in (None, "default") else f" --database {alias}")
    missing = [m for m, backwards in plan if not backwards]
    ours = [m.name for m in missing if m.app_label == "django_delayjobs"]
    if ours:
        return (f"{where} lacks {len(ours)} migration(s) of django_delayjobs "
                f"({ours[0]} to {ours[-1]}): run {migrate} ({exc})")  # fmt: skip
    if missing:
        names = ", ".join(f"{m.app_label}.{m.name}" for m in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        return (f"{where} lacks {len(missing)} migration(s) ({names}{more}): "
                f"run {migrate} ({exc})")  # fmt: skip
    return f"{where} is unavailable: {exc}"
