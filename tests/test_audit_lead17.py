"""Audit lead17: the undo of a handed-back claim bounded its wait with a session-level
``SET statement_timeout``, which a pooled connection (Django's ``OPTIONS["pool"]``) or a
transaction-mode pgbouncer kept for whoever used that connection next: a later action or
claim failed after under 2 s. The bound is now the transaction's own."""

from __future__ import annotations

import pytest
from django.db import connection

from django_delayjobs import sql

pytestmark = pytest.mark.django_db(transaction=True)


def statement_timeout() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        return str(cursor.fetchone()[0])


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's statement timeout")
def test_a_bounded_transaction_leaves_the_session_as_it_found_it():
    before = statement_timeout()
    with sql.waiting_at_most(0.25):
        assert statement_timeout() == "250ms"
    assert statement_timeout() == before


def test_an_unbounded_one_is_a_plain_transaction():
    with sql.waiting_at_most(None):
        assert connection.in_atomic_block
    assert not connection.in_atomic_block
