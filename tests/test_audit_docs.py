"""Audit: failing tests for docs/docstring claims the code does not keep."""

from __future__ import annotations

import pytest
from django.db import transaction
from django.dispatch import Signal

from django_delayjobs import cancel_on, schedule
from django_delayjobs.exceptions import AlreadyRunning
from django_delayjobs.models import Job, Status
from tests.testapp.models import Thing

pytestmark = pytest.mark.django_db


@pytest.fixture
def thing():
    return Thing.objects.create(name="t")


def test_cancel_on_returns_a_receiver_that_disconnects_and_honours_each_options(thing):
    """cancel_on "returns the receiver": signal.disconnect(receiver) left it connected
    (it was connected under a dispatch_uid), and a second cancel_on for the same signal,
    action and sender with another name or fail_if_running was silently not connected."""
    paid = Signal()
    plain = cancel_on(paid, Thing.expire, sender=Thing, name="paid")
    assert cancel_on(paid, Thing.expire, sender=Thing, name="paid") is plain  # ready() twice
    strict = cancel_on(paid, Thing.expire, sender=Thing, name="paid", fail_if_running=True)
    running = schedule(thing.expire, in_=60)
    Job.objects.filter(pk=running.pk).update(status=Status.RUNNING)
    with pytest.raises(AlreadyRunning), transaction.atomic():
        paid.send(sender=Thing, instance=thing)
    assert paid.disconnect(strict, sender=Thing)
    assert paid.disconnect(plain, sender=Thing)
    assert not paid.has_listeners(Thing)
