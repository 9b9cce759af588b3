"""The job list's date hierarchy and filters, without reading every row to draw them.

Django's date hierarchy lists the years, months or days that hold rows with a ``SELECT
DISTINCT DATE_TRUNC(...)`` over the whole (filtered) table; its value filters run a
``SELECT DISTINCT`` too. On a million jobs each costs hundreds of milliseconds per request.
Here the date hierarchy asks ``EXISTS`` once per candidate period (a range probe of the
``run_at`` index), the queue filter walks the ``(queue, status)`` index one value at a
time, and the action filter lists the actions of the latest jobs.
"""

from __future__ import annotations

import datetime
from typing import Any

from django.conf import settings
from django.contrib.admin import AllValuesFieldListFilter
from django.contrib.admin.views.main import ChangeList
from django.db.models import Max, Min, QuerySet
from django.utils import formats, timezone
from django.utils.text import capfirst
from django.utils.translation import gettext as _

Choice = dict[str, Any]


def _start(year: int, month: int = 1, day: int = 1) -> datetime.datetime:
    start = datetime.datetime(year, month, day)
    return timezone.make_aware(start) if settings.USE_TZ else start


def _next_month(start: datetime.datetime) -> datetime.datetime:
    return _start(*(start.year + 1, 1) if start.month == 12 else (start.year, start.month + 1))


class JobChangeList(ChangeList):
    #: At most this many years are listed (one stray row from 1970 costs no 50 probes).
    max_years = 30

    def _holds(self, start: datetime.datetime, end: datetime.datetime) -> bool:
        field = self.date_hierarchy
        rows = self.queryset.filter(**{f"{field}__gte": start, f"{field}__lt": end})
        # ORDER BY the field, not EXISTS: with a bare LIMIT 1 PostgreSQL may pick a
        # sequential scan that only meets the period's rows near the table's end.
        return rows.order_by(field).values_list("pk", flat=True)[:1].first() is not None

    def _link(self, **parts: int) -> str:
        field = self.date_hierarchy
        filters = {f"{field}__{part}": value for part, value in parts.items()}
        return str(self.get_query_string(filters, [f"{field}__"]))

    def date_hierarchy_links(self) -> dict[str, Any]:
        """What Django's ``{% date_hierarchy %}`` renders, found with index probes."""
        field = self.date_hierarchy
        try:
            year, month, day = (
                int(self.params[f"{field}__{part}"]) if f"{field}__{part}" in self.params else None
                for part in ("year", "month", "day")
            )
        except ValueError:
            return {"show": False}
        years: range | None = None
        if year is None:
            bounds = self.queryset.aggregate(first=Min(field), last=Max(field))
            if bounds["first"] is None:
                return {"show": True, "back": None, "choices": []}
            first, last = bounds["first"], bounds["last"]
            if settings.USE_TZ:
                first, last = timezone.localtime(first), timezone.localtime(last)
            if first.year != last.year:
                years = range(max(first.year, last.year - self.max_years + 1), last.year + 1)
            else:
                year = first.year
                month = first.month if first.month == last.month else None
        if years is not None:
            return {"show": True, "back": None, "choices": self._years(years)}
        assert year is not None
        if month is None:
            back = {"link": self._link(), "title": _("All dates")}
            return {"show": True, "back": back, "choices": self._months(year)}
        if day is None:
            back = {"link": self._link(year=year), "title": str(year)}
            return {"show": True, "back": back, "choices": self._days(year, month)}
        date = datetime.date(year, month, day)
        return {
            "show": True,
            "back": {
                "link": self._link(year=year, month=month),
                "title": capfirst(formats.date_format(date, "YEAR_MONTH_FORMAT")),
            },
            "choices": [{"title": capfirst(formats.date_format(date, "MONTH_DAY_FORMAT"))}],
        }

    def _years(self, years: range) -> list[Choice]:
        return [
            {"link": self._link(year=y), "title": str(y)}
            for y in years
            if self._holds(_start(y), _start(y + 1))
        ]

    def _months(self, year: int) -> list[Choice]:
        choices = []
        for month in range(1, 13):
            start = _start(year, month)
            if self._holds(start, _next_month(start)):
                title = capfirst(formats.date_format(start.date(), "YEAR_MONTH_FORMAT"))
                choices.append({"link": self._link(year=year, month=month), "title": title})
        return choices

    def _days(self, year: int, month: int) -> list[Choice]:
        choices = []
        start, end = _start(year, month), _next_month(_start(year, month))
        while start < end:
            following = _start(*(start + datetime.timedelta(days=1)).timetuple()[:3])
            if self._holds(start, following):
                title = capfirst(formats.date_format(start.date(), "MONTH_DAY_FORMAT"))
                link = self._link(year=year, month=month, day=start.day)
                choices.append({"link": link, "title": title})
            start = following
        return choices


def distinct_by_index(queryset: QuerySet[Any], field: str, limit: int = 100) -> list[Any]:
    """The distinct values of ``field``, one index probe each (``ORDER BY field LIMIT 1``).

    A loose index scan: cheap while the values are few, whatever the number of rows.
    """
    values = queryset.order_by(field).values_list(field, flat=True)
    found: list[Any] = []
    value = values.first()
    while value is not None and len(found) < limit:
        found.append(value)
        value = values.filter(**{f"{field}__gt": value}).first()
    return found


class QueueFilter(AllValuesFieldListFilter):
    """Every queue that holds a job, found through the ``(queue, status)`` index."""

    def __init__(self, field: Any, request: Any, params: Any, model: Any, model_admin: Any,
                 field_path: str) -> None:  # fmt: skip
        super().__init__(field, request, params, model, model_admin, field_path)
        values = distinct_by_index(model_admin.get_queryset(request), field.name)
        self.lookup_choices = values  # type: ignore[assignment]  # choices() only iterates


class ActionFilter(AllValuesFieldListFilter):
    """The actions of the latest jobs (by due time), and the one selected.

    ``action`` has no index of its own, so a full list would read every row.
    """

    #: How many of the latest jobs to look at.
    recent = 5_000

    def __init__(self, field: Any, request: Any, params: Any, model: Any, model_admin: Any,
                 field_path: str) -> None:  # fmt: skip
        super().__init__(field, request, params, model, model_admin, field_path)
        # A plain read of the newest rows: PostgreSQL plans "DISTINCT ... WHERE id IN
        # (newest ids)" as a scan of the whole table.
        newest = model_admin.get_queryset(request).order_by("-run_at")
        names = set(newest.values_list(field.name, flat=True)[: self.recent])
        names.update(self.lookup_val or ())
        self.lookup_choices = sorted(names)  # type: ignore[assignment]  # choices() iterates
