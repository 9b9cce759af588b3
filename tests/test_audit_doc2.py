"""The docs' code runs as they show it, and their tables name what the code defines: the
shell snippet of docs/operations.md that forgets orphaned garbage, and docs/metrics.md's
tables of metric families against the exposition."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from django_delayjobs.connection import get_engine
from django_delayjobs.models import Job

from .test_rest_helpers import dead_job

ROOT = Path(__file__).resolve().parent.parent


def snippet(doc: str, after: str) -> str:
    """The first Python block of ``docs/<doc>`` after the text ``after``, dedented."""
    text = (ROOT / "docs" / doc).read_text().split(after, 1)[1]
    block = re.search(r"```python\n(.*?)```", text, re.DOTALL)
    assert block is not None, f"{doc}: no python block after {after!r}"
    return textwrap.dedent(block[1])


@pytest.mark.django_db(transaction=True)
def test_the_shell_snippet_that_forgets_orphaned_garbage_runs():
    """docs/operations.md: `queues.queue_names()` returns (names, why), so the snippet's
    loop went over that pair and failed on its first name."""
    orphan = dead_job()
    kept = dead_job()
    Job.objects.filter(pk=orphan.pk).delete()  # its row deleted by hand
    exec(snippet("operations.md", "with a **Forget** button"), {})
    assert [job_id for job_id, _ in get_engine().garbage(kept.queue, 10)] == [str(kept.pk)]
