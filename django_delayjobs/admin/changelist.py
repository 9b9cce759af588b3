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
from django.contrib.admin.exceptions import DisallowedModelAdminLookup
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ORDER_VAR, ChangeList
from django.db.models import Max, Min, QuerySet
from django.utils import formats, timezone
from django.utils.text import capfirst
from django.utils.translation import gettext as _

from ..rows import POISON

Choice = dict[str, Any]
Bounds = tuple[datetime.datetime | None, datetime.datetime | None]
#: The times Python represents: the drill-down looks at rows within them (a poison row
#: beyond them, 'infinity' or year 10000, would make the aggregate unreadable).
SHOWN = (datetime.datetime.min.replace(tzinfo=datetime.UTC),
         datetime.datetime.max.replace(tzinfo=datetime.UTC))  # fmt: skip


def _start(year: int, month: int = 1, day: int = 1) -> datetime.datetime | None:
    """Local midnight of that day; None past the ends of the datetime range (year 1 in a
    zone ahead of UTC, 10000), where the period is open on that side."""
    try:
        start = datetime.datetime(year, month, day)
        if not settings.USE_TZ:
            return start
        aware = timezone.make_aware(start)
        aware.astimezone(datetime.UTC)  # how the database receives it: it must exist
    except (OverflowError, ValueError):
        return None
    return aware


def _local(at: datetime.datetime) -> datetime.datetime:
    """``at`` in the current time zone; in UTC if that would leave years 1-9999."""
    try:
        return timezone.localtime(at)
    except OverflowError:
        return at


def _next_month(year: int, month: int) -> datetime.datetime | None:
    return _start(*(year + 1, 1) if month == 12 else (year, month + 1))


def _next_day(year: int, month: int, day: int) -> datetime.datetime | None:
    try:
        following = datetime.date(year, month, day) + datetime.timedelta(days=1)
    except OverflowError:  # 9999-12-31
        return None
    return _start(following.year, following.month, following.day)


def period(year: int, month: int | None = None, day: int | None = None) -> Bounds:
    """The local (start, end) of a year, month or day; None for a side with no bound."""
    if month is None:
        return _start(year), _start(year + 1)
    if day is None:
        return _start(year, month), _next_month(year, month)
    return _start(year, month, day), _next_day(year, month, day)


class JobChangeList(ChangeList):
    #: At most this many years are listed (one stray row from 1970 costs no 50 probes).
    max_years = 30

    def get_filters_params(self, params: Any = None) -> Any:
        """Turn the drill-down's year/month/day into bounds here: Django's own conversion
        overflows on year 9999 (and on year 1 in a zone ahead of UTC).

        The drill-down is a year, a year and month, or a full date; anything else (a day
        without a year, a day that no month has) is Django's "?e=1", never a 500. Bounds
        given directly are refused (400): unchecked, a time whose UTC falls outside years
        1-9999 overflows on its way to the database.
        """
        lookup = super().get_filters_params(params)
        field = self.date_hierarchy
        if f"{field}__gte" in lookup or f"{field}__lt" in lookup:
            raise DisallowedModelAdminLookup(f"Filter {field} with the date drill-down")
        parts = [lookup.pop(f"{field}__{part}", None) for part in ("year", "month", "day")]
        if parts == [None, None, None]:
            return lookup
        try:
            year, month, day = (None if p is None else int(p[-1]) for p in parts)
            if year is None or (month is None and day is not None):
                raise ValueError("the date drill-down takes a year, then a month, then a day")
            # a real date (not ``month or 1``: a month or day of 0 is none)
            datetime.date(year, 1 if month is None else month, 1 if day is None else day)
        except (OverflowError, ValueError) as exc:
            raise IncorrectLookupParameters(exc) from exc
        start, end = period(year, month, day)
        if start is None and end is None:
            raise IncorrectLookupParameters(f"no such period: {year}-{month}-{day}")
        if start is not None:
            lookup[f"{field}__gte"] = [start]
        if end is not None:
            lookup[f"{field}__lt"] = [end]
        return lookup

    def get_ordering_field(self, field_name: Any) -> Any:
        """None (not sortable) for a column ``sortable_by`` leaves out: Django sorts by any
        column a ``?o=`` names, and only ``run_at``'s index serves a sorted page."""
        if self.sortable_by is not None and field_name not in self.sortable_by:
            return None
        return super().get_ordering_field(field_name)

    def get_ordering(self, request: Any, queryset: QuerySet[Any]) -> list[Any]:
        """A ``?o=`` that names no column that sorts is dropped: Django then ordered the
        page by the primary key alone, not by the list's own order (latest due first)."""
        asked = self.params.get(ORDER_VAR)
        if asked and not any(map(self._sorts, str(asked).split("."))):
            self.params = {k: v for k, v in self.params.items() if k != ORDER_VAR}
        return super().get_ordering(request, queryset)

    def _sorts(self, part: str) -> bool:
        try:
            return bool(self.get_ordering_field(self.list_display[int(part.rpartition("-")[2])]))
        except (IndexError, ValueError):
            return False

    def _holds(self, start: datetime.datetime | None, end: datetime.datetime | None) -> bool:
        field = self.date_hierarchy
        bounds = {f"{field}__gte": start, f"{field}__lt": end}
        rows = self.queryset.filter(**{k: v for k, v in bounds.items() if v is not None})
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
            shown = self.queryset.filter(**{f"{field}__gte": SHOWN[0], f"{field}__lte": SHOWN[1]})
            try:
                bounds = shown.aggregate(first=Min(field), last=Max(field))
            except POISON:  # text SQLite cannot parse as a time: no drill-down
                return {"show": False}
            if bounds["first"] is None:
                return {"show": True, "back": None, "choices": []}
            first, last = bounds["first"], bounds["last"]
            if settings.USE_TZ:
                first, last = _local(first), _local(last)
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
            {"link": self._link(year=y), "title": str(y)} for y in years if self._holds(*period(y))
        ]

    def _months(self, year: int) -> list[Choice]:
        choices = []
        for month in range(1, 13):
            if self._holds(*period(year, month)):
                date = datetime.date(year, month, 1)
                title = capfirst(formats.date_format(date, "YEAR_MONTH_FORMAT"))
                choices.append({"link": self._link(year=year, month=month), "title": title})
        return choices

    def _days(self, year: int, month: int) -> list[Choice]:
        choices = []
        date = datetime.date(year, month, 1)
        while date.month == month:
            if self._holds(*period(year, month, date.day)):
                title = capfirst(formats.date_format(date, "MONTH_DAY_FORMAT"))
                link = self._link(year=year, month=month, day=date.day)
                choices.append({"link": link, "title": title})
            if date == datetime.date.max:
                break
            date += datetime.timedelta(days=1)
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
