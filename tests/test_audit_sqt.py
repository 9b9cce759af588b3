"""Audit of key squatting through callbacks/: a caller with ``add_job`` alone may hold a
key in any queue while ``API_CALLBACK_QUEUES`` is ``None``; ``check --deploy`` says so."""

from __future__ import annotations

import ipaddress

import pytest
from django.core.cache import cache
from django.core.checks import run_checks

from django_delayjobs import schedule
from django_delayjobs.callbacks import policy
from django_delayjobs.callbacks.action import ACTION
from django_delayjobs.callbacks.signing import new_secret
from django_delayjobs.models import Job
from tests.testapp import tasks

from .test_rest_helpers import client_for, make_user, url

pytestmark = pytest.mark.django_db(transaction=True)

W004 = "django_delayjobs.W004"
HOOK = "https://hooks.example.com/orders/42/expire"
KEY = "order-42-autocancel"
LOGGED_IN = "rest_framework.permissions.IsAuthenticated"


def warned(*, deploy: bool) -> bool:
    return any(m.id == W004 for m in run_checks(include_deployment_checks=deploy))


def test_callbacks_that_may_name_any_queue_are_a_deploy_warning(settings):
    """The default, ``None``, lets a caller put a callback in any queue, the queues of
    the project's own keyed jobs included: ``check --deploy`` warns, naming the setting;
    the checks every command runs (``run_delayworker``'s start-up) do not."""
    assert warned(deploy=True)
    (found,) = [m for m in run_checks(include_deployment_checks=True) if m.id == W004]
    assert "API_CALLBACK_QUEUES" in found.msg and "API_CALLBACK_QUEUES" in found.hint
    assert not warned(deploy=False)
    settings.DELAYJOBS = {**settings.DELAYJOBS, "API_CALLBACK_QUEUES": ["callbacks"]}
    assert not warned(deploy=True)


def test_a_project_without_the_rest_api_is_not_warned(settings):
    """``callbacks/`` unreachable (only ``django_delayjobs.urls`` routed): no caller."""
    settings.ROOT_URLCONF = "django_delayjobs.urls"
    assert not warned(deploy=True)


def test_a_urlconf_that_fails_to_load_leaves_the_warning_to_djangos_own_check(settings):
    """The check reads the URLconf: one that cannot be imported does not fail W004's check
    (Django's own urls check reports it), which then neither warns nor raises."""
    from django.urls import clear_url_caches

    settings.ROOT_URLCONF = "tests.no_such_urlconf"
    clear_url_caches()
    try:
        found = run_checks(include_deployment_checks=True, tags=["security"])
        assert W004 not in {m.id for m in found}
    finally:
        clear_url_caches()


@pytest.fixture
def service(settings):
    """A service account: logged in, not staff, holding ``add_job`` alone."""
    settings.DELAYJOBS = {**settings.DELAYJOBS, "HTTP_ALLOWED_HOSTS": ["hooks.example.com"],
                          "HTTP_SIGNING_SECRETS": [new_secret()],
                          "API_PERMISSION_CLASSES": [LOGGED_IN]}  # fmt: skip
    cache.clear()  # throttle history
    with policy.use_resolver(lambda host, port: [ipaddress.ip_address("93.184.215.14")]):
        yield client_for(make_user("svc", staff=False, perms=("add_job",)))


def post(client, **body):
    return client.post(url("callbacks"), {"url": HOOK, "in": 60, "key": KEY, **body},
                       format="json")  # fmt: skip


def test_any_queue_lets_a_caller_hold_the_key_of_a_job_of_yours(service):
    """As documented (and warned of): the callback holds the key in ``orders``, and the
    project's own ``schedule(..., key=...)`` gets it back instead of its job."""
    assert post(service, queue="orders").status_code == 201
    job = schedule(tasks.record, in_=60, args=["cancel"], queue="orders", key=KEY)
    assert job.action == ACTION
    assert not Job.objects.filter(action__endswith="record").exists()


def test_listed_queues_keep_a_caller_out_of_the_others(service, settings):
    settings.DELAYJOBS = {**settings.DELAYJOBS, "API_CALLBACK_QUEUES": ["callbacks"]}
    for queue in ({"queue": "orders"}, {}):  # named, or the default queue
        refused = post(service, **queue)
        assert refused.status_code == 400 and "queue" in refused.json(), refused.content
    assert post(service, queue="callbacks").status_code == 201
    job = schedule(tasks.record, in_=60, args=["cancel"], queue="orders", key=KEY)
    assert job.action != ACTION
    assert set(Job.objects.values_list("queue", flat=True)) == {"callbacks", "orders"}
