"""Audit of serialization and the backend's door, second pass. One test per class of
defect; each says what used to happen."""

from __future__ import annotations

from typing import Any

import pytest

from django_delayjobs import schedule
from django_delayjobs.models import Job
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

LONG = "k" * 100_000


def _deep(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "kwargs",
    [{LONG: _deep(40)}, {LONG: [0, "\x00"]}, {LONG: {LONG: [1, 2**80]}}, {"a": {LONG: {3}}}],
    ids=["too-deep", "nul", "big-int", "set"],
)
def test_a_long_key_is_quoted_short_in_the_path(kwargs):
    """The path of a value repeated the whole repr of every parent key (built for every
    element, even when nothing was wrong): 2.4 MB of kwargs took 11 s of CPU to refuse,
    and the message quoted each key in full."""
    with pytest.raises((TypeError, ValueError)) as refused:
        schedule(tasks.keep, in_=0, kwargs=kwargs)
    assert len(str(refused.value)) < 2_000
    assert not Job.objects.exists()
