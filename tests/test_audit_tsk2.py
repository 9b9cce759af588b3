"""Audit of the django.tasks backend and of the services' job references."""

from __future__ import annotations

import uuid

import pytest
from django.core.exceptions import ValidationError

from django_delayjobs import services
from django_delayjobs.models import Job

pytestmark = pytest.mark.django_db(transaction=True)


MALFORMED = ["not-a-uuid", b"0" * 32, 1.5, [1], "", "\x00", -1, 2**200, None, True]
MISSING = [uuid.uuid4(), str(uuid.uuid4()).upper(), 42]


@pytest.mark.parametrize("verb", ["cancel", "reschedule", "requeue", "purge"])
def test_services_refuse_a_malformed_job_id_with_validation_error(verb):
    call = {"reschedule": lambda ref: services.reschedule(ref, in_=60)}.get(
        verb, getattr(services, verb)
    )
    for ref in MALFORMED:
        with pytest.raises(ValidationError):
            call(ref)
    for ref in MISSING:
        with pytest.raises(Job.DoesNotExist):
            call(ref)
