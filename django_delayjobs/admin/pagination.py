"""A paginator that never counts a million rows to draw the page links.

Small results are counted exactly, but the count stops at ``exact_up_to`` rows (a
``COUNT(*)`` over a ``LIMIT``ed subquery). Beyond that, on PostgreSQL, the number is the
planner's: ``pg_class.reltuples`` for the whole table, ``EXPLAIN``'s row estimate for a
filtered list. Other databases count exactly (SQLite is for development). With an
estimate, at most ``max_pages`` pages are offered: a deep OFFSET reads every row before it.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from django.core.paginator import Paginator
from django.db import connections
from django.db.models import QuerySet
from django.utils.functional import cached_property

if TYPE_CHECKING:
    BasePaginator = Paginator[Any]
else:
    BasePaginator = Paginator


class EstimatedCountPaginator(BasePaginator):
    #: Results up to this size are counted exactly; larger ones are estimated.
    exact_up_to = 10_000

    #: True when ``count`` is an estimate (the pagination template says "about").
    estimated = False

    #: Pages offered at most when the count is estimated. Page n costs an OFFSET of
    #: n * per_page rows; beyond this, narrow the list with filters or dates instead.
    max_pages = 1000

    @cached_property
    def count(self) -> int:
        qs = self.object_list
        if not isinstance(qs, QuerySet) or connections[qs.db].vendor != "postgresql":
            return super().count
        qs = qs.order_by()
        if not qs.query.where:
            estimate = self._table_estimate(qs)
            if estimate is not None and estimate > self.exact_up_to:
                self.estimated = True
                return estimate
        exact = qs[: self.exact_up_to + 1].count()
        if exact <= self.exact_up_to:
            return exact
        self.estimated = True
        return max(self._plan_estimate(qs), exact)

    @cached_property
    def num_pages(self) -> int:
        pages = super().num_pages
        return min(pages, self.max_pages) if self.estimated else pages

    @staticmethod
    def _table_estimate(qs: QuerySet[Any]) -> int | None:
        """Rows in the whole table per the last ANALYZE; None if never analysed."""
        with connections[qs.db].cursor() as cursor:
            cursor.execute(
                "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
                [connections[qs.db].ops.quote_name(qs.model._meta.db_table)],
            )
            row = cursor.fetchone()
        # -1 (PostgreSQL 14+) or 0: never vacuumed or analysed, so no estimate at all.
        return int(row[0]) if row and row[0] > 0 else None

    @staticmethod
    def _plan_estimate(qs: QuerySet[Any]) -> int:
        """The planner's row estimate for a filtered query (EXPLAIN, nothing executed)."""
        plan = json.loads(qs.explain(format="json"))
        return int(plan[0]["Plan"]["Plan Rows"])
