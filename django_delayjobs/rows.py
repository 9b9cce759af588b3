"""Reading Job rows that hold values the door would refuse (poison rows), without failing.

A row written by an older version, a manual edit or a bug may hold a time PostgreSQL
stores but Python cannot represent ('infinity', year 10000, a BC date), text SQLite
cannot parse as a time, JSON nested deeper than Python's parser recurses, or an integer
too long for ``int()``. Reading such a row the ordinary way raises (``DataError``,
``ValueError``, ``RecursionError``) and takes every other row of the page with it.

``tolerant(queryset)`` reads the ordinary way and, only if that fails, reads the rest
again with every datetime, JSON and UUID column cast to text, converting each value on
its own: a value that cannot be converted becomes an ``Unreadable`` (its stored text, and
why) in its field, and the row is shown like any other. It reads a job's history
(``JobEvent``) the same way. ``unreadable_fields(job)`` says which fields of a job are
such values (for a worker that must settle the job as dead).
"""

from __future__ import annotations

import itertools
import json
import logging
import uuid
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from django.db import DataError, connections, models
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models.functions import Cast
from django.db.models.query import ModelIterable
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from .logs import one_line
from .models import Job

logger = logging.getLogger("django_delayjobs")

M = TypeVar("M", bound=models.Model)

#: What converting a stored value may raise when the value is poison: psycopg's loaders
#: (``DataError``), ``json.loads`` (``ValueError`` for > 4,300 digits, ``RecursionError``),
#: SQLite's datetime converter (``ValueError``, or ``AttributeError`` on text it cannot
#: parse at all), ``uuid.UUID`` and time zone arithmetic (``OverflowError``).
POISON = (DataError, ValueError, ArithmeticError, RecursionError, AttributeError, TypeError)


class Unreadable(str):
    """A stored value that cannot be read as its field's type: the text the database
    holds, shown as it is, with ``error`` saying why it could not be read."""

    error: str

    def __new__(cls, raw: object, error: str) -> Unreadable:
        self = super().__new__(cls, _text(raw))
        self.error = error
        return self


def _text(raw: object) -> str:
    text = raw if isinstance(raw, str) else repr(raw)
    return text if len(text) <= 1000 else f"{text[:1000]}... ({len(text)} characters)"


def unreadable_fields(job: Job) -> dict[str, Unreadable]:
    """The fields of ``job`` (read by ``tolerant``) whose stored value could not be read."""
    return {
        field.attname: value
        for field in Job._meta.concrete_fields
        if isinstance(value := getattr(job, field.attname), Unreadable)
    }


def tolerant(queryset: models.QuerySet[M, M]) -> models.QuerySet[M, M]:
    """``queryset``, reading poison rows with ``Unreadable`` values instead of raising."""
    clone = queryset.all()
    clone._iterable_class = TolerantIterable
    return clone


def read_job(pk: uuid.UUID | str, using: str | None = None) -> Job | None:
    """The job with this id, read tolerantly, or None if there is none."""
    jobs = Job.objects.using(using) if using else Job.objects.all()
    return tolerant(jobs.filter(pk=pk)).first()


class TolerantIterable(ModelIterable):  # type: ignore[type-arg]
    """Model instances as usual; from the first row that cannot be read, value by value."""

    def __iter__(self) -> Iterator[models.Model]:
        done = 0
        try:
            for row in super().__iter__():
                yield row
                done += 1
        except POISON as exc:
            logger.warning(
                "a %s row cannot be read (%s: %s); reading the rest value by value",
                self.queryset.model._meta.model_name, type(exc).__name__,
                one_line(_text(str(exc))),
            )  # fmt: skip
            yield from itertools.islice(self._value_by_value(), done, None)

    def _value_by_value(self) -> Iterator[models.Model]:
        queryset = self.queryset
        model, alias = queryset.model, queryset.db
        conn = connections[alias]
        fields = model._meta.concrete_fields
        as_text = (models.DateTimeField, models.JSONField, models.UUIDField)
        columns = [
            Cast(field.attname, models.TextField()) if isinstance(field, as_text) else field.attname
            for field in fields
        ]
        values_list = queryset.values_list(*columns)
        rows: Iterable[tuple[Any, ...]] = values_list
        if self.chunked_fetch:
            rows = values_list.iterator(chunk_size=self.chunk_size or 2000)
        attnames = [field.attname for field in fields]
        for row in rows:
            values = [_convert(field, raw, conn) for field, raw in zip(fields, row, strict=True)]
            if isinstance(values[0], Unreadable):  # no id to show or link to: leave it out
                logger.warning("a job row has an id that is not a UUID: %r", values[0])
                continue
            yield model.from_db(alias, attnames, values)


def _convert(field: models.Field[Any, Any], raw: Any, conn: BaseDatabaseWrapper) -> Any:
    if raw is None:
        return None
    try:
        if isinstance(field, models.DateTimeField):
            return parse_time(raw, conn)
        if isinstance(field, models.JSONField):
            return json.loads(raw)
        if isinstance(field, models.UUIDField):
            return uuid.UUID(raw)
    except POISON as exc:
        return Unreadable(raw, f"{type(exc).__name__}: {_text(str(exc))}")
    return raw


def parse_time(text: str, conn: BaseDatabaseWrapper) -> Any:
    """A datetime column read as text (``run_at::text``) as an aware datetime, or raise."""
    value = parse_datetime(text)
    if value is None:
        raise ValueError(f"{text!r} is not a date and time Python can represent")
    if timezone.is_naive(value):  # SQLite keeps UTC (or the database's TIME_ZONE) as text
        value = timezone.make_aware(value, conn.timezone)
    return value
