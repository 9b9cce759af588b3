"""Audit: cancel_for with another model's method cancelled the object's own method of that name."""

from __future__ import annotations

import pytest

from django_delayjobs import cancel_for, schedule
from django_delayjobs.models import Job, Status
from tests.testapp.models import Sku, Thing

pytestmark = pytest.mark.django_db


def test_cancel_for_refuses_a_method_of_another_model():
    """cancel_for(thing, Sku.touch) named the action 'testapp.Thing.touch' from the
    object's model and the method's name alone: it cancelled thing's Thing.touch jobs,
    which the caller did not name."""
    thing = Thing.objects.create(name="t")
    job = schedule(thing.touch, in_=60)
    with pytest.raises(TypeError, match="Sku"):
        cancel_for(thing, Sku.touch)
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED
    assert cancel_for(thing, Thing.touch) == 1
