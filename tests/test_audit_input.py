"""Input audit: hostile or unusual values that an entry point accepts and then cannot
store, run or show, or that fail with an error other than TypeError/InvalidSchedule.

Each test states what DESIGN.md and the docs promise; each fails on the code it was
written against (they are reports, not fixes)."""

from __future__ import annotations

import datetime
import ipaddress

import pytest
from django.apps import apps
from django.db import DatabaseError, connection, models, transaction
from django.dispatch import Signal
from django.urls import reverse

from django_delayjobs import cancel_on, delayable, schedule, schedule_http, schedule_many
from django_delayjobs.callbacks import policy
from django_delayjobs.callbacks.signing import new_secret
from django_delayjobs.checks import check_settings
from django_delayjobs.exceptions import InvalidSchedule
from django_delayjobs.models import Job, JobEvent, Status
from django_delayjobs.services import build_job
from tests.testapp import tasks
from tests.testapp.models import Thing

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _clean_redis(redis_client):
    """Every test starts from an empty Redis database."""


@pytest.fixture
def thing():
    return Thing.objects.create(name="t")


def refused_cleanly(call, redis_client) -> Exception:
    """``call()`` raises TypeError or InvalidSchedule (docs/scheduling.md: "catching
    (TypeError, ValueError) is enough") and writes nothing."""
    before = Job.objects.count(), JobEvent.objects.count()
    with pytest.raises(Exception) as info:  # noqa: PT011 - the type is what is checked
        call()
    assert isinstance(info.value, TypeError | InvalidSchedule), repr(info.value)
    assert (Job.objects.count(), JobEvent.objects.count()) == before
    return info.value


# -- 1. a tzinfo that cannot give an offset ------------------------------------------------


class NoOffset(datetime.tzinfo):
    """A tzinfo subclass that forgot utcoffset() (the base class raises
    NotImplementedError). timing.aware() means to catch "a tzinfo that cannot answer"."""

    def tzname(self, dt):
        return "XYZ"


ODD = datetime.datetime(2030, 1, 1, tzinfo=NoOffset())


@pytest.mark.parametrize(
    "call",
    [
        lambda t, job: schedule(t.touch, at=ODD),
        lambda t, job: schedule(t.touch, in_=1, expires=ODD),
        lambda t, job: schedule(tasks.echo, in_=1, args=[ODD]),
        lambda t, job: job.reschedule(at=ODD),
    ],
    ids=["at", "expires", "args", "reschedule-at"],
)
def test_a_tzinfo_without_utcoffset_is_refused_with_a_documented_error(thing, redis_client, call):
    """timing.aware() catches ArithmeticError/ValueError/TypeError from a tzinfo "that
    cannot answer", not NotImplementedError; serialization._datetime() catches nothing.
    Today NotImplementedError('a tzinfo subclass must implement utcoffset()') escapes."""
    job = schedule(thing.touch, in_=60)
    refused_cleanly(lambda: call(thing, job), redis_client)
    assert Job.objects.get(pk=job.pk).run_at == job.run_at


# -- 2. schedule_http: a form with a lone surrogate ---------------------------------------


@pytest.fixture
def http(settings):
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": ["hooks.example.com"],
        "HTTP_SIGNING_SECRETS": [new_secret()],
    }
    with policy.use_resolver(lambda host, port: [ipaddress.ip_address("93.184.215.14")]):
        yield settings


@pytest.mark.parametrize("form", [{"a": "\ud800"}, {"\udfff": "x"}])
def test_schedule_http_refuses_a_form_with_a_lone_surrogate_as_invalid_schedule(
    http, redis_client, form
):
    """docs/scheduling.md: nothing raised for bad input is a bare UnicodeEncodeError.
    A str body with a surrogate is refused ("the body holds a lone surrogate"); the same
    text in a data= dict escapes urlencode() as UnicodeEncodeError."""
    error = refused_cleanly(
        lambda: schedule_http("https://hooks.example.com/x", in_=10, data=form), redis_client
    )
    assert not isinstance(error, UnicodeError), repr(error)


# -- 3. schedule_http: a URL with non-ASCII characters is accepted, never delivered --------


@pytest.fixture
def local_http(settings, callback_server):
    settings.DELAYJOBS = {
        **settings.DELAYJOBS,
        "HTTP_ALLOWED_HOSTS": [callback_server.netloc],
        "HTTP_ALLOW_PRIVATE_NETWORKS": True,
        "HTTP_SIGNING_SECRETS": [new_secret()],
        "RETRY_BACKOFF_SECONDS": 0.01,
        "HTTP_READ_TIMEOUT_SECONDS": 2.0,
    }
    return settings


@pytest.mark.parametrize("path", ["/caf\u00e9", "/x?q=\u202e"])
def test_a_url_with_non_ascii_characters_is_refused_or_delivered(local_http, callback_server, path):
    """Either the door refuses the URL (as it refuses a destination path that is not
    visible ASCII) or the delivery sends it (percent-encoded). Today schedule_http and
    POST callbacks/ accept it, and every attempt dies in http.client with
    "UnicodeEncodeError: 'ascii' codec can't encode character"."""
    from tests.test_callbacks_e2e import run

    try:
        job = schedule_http(callback_server.url(path), in_=0, max_attempts=1)
    except (TypeError, ValueError):
        return  # refused at the door: fine
    job = run(job)
    assert job.status == Status.SUCCEEDED, job.last_error.strip().splitlines()[-1]
    assert len(callback_server.requests) == 1


# -- 4. the admin's date drill-down with a day and no year ----------------------------------


@pytest.mark.parametrize("day", ["31", "0"])
def test_admin_job_list_with_a_day_but_no_year_is_no_500(admin_client, day):
    """All jobs due in one 30-day month: JobChangeList.date_hierarchy_links() takes the
    year and month from the rows and the day from the query, and datetime.date(2030, 11,
    31) raises ValueError (a 500). get_filters_params() only validates the day when a
    year is given."""
    for at in (datetime.datetime(2030, 11, 5, tzinfo=datetime.UTC),
               datetime.datetime(2030, 11, 20, tzinfo=datetime.UTC)):  # fmt: skip
        schedule(tasks.record, at=at, args=["x"])
    base = reverse("admin:django_delayjobs_job_changelist")
    response = admin_client.get(base, {"run_at__day": day})
    assert response.status_code in (200, 302, 400)


# -- 5. a float setting given an int beyond a float's range --------------------------------


@pytest.mark.parametrize("name", ["TICK_SECONDS", "LEASE_SECONDS", "MAX_RUN_SECONDS"])
def test_a_huge_int_for_a_float_setting_is_a_check_error(settings, name):
    """conf._type_error() calls math.isfinite(10**400), which raises OverflowError: the
    system check (and every use of delayjobs_settings) fails with a traceback instead of
    reporting django_delayjobs.E003."""
    settings.DELAYJOBS = {name: 10**400}
    errors = check_settings()
    assert [e.id for e in errors] == ["django_delayjobs.E003"]


# -- 6. cancel_on: a name whose actor does not fit ------------------------------------------


def test_cancel_on_refuses_a_name_whose_actor_cannot_be_stored_when_connecting(thing):
    """cancel_on() accepts name='n' * 150; its receiver's actor 'signal:' + name is 157
    characters, which JobEvent.actor (150) refuses. The problem shows only when the signal
    fires with a job to cancel: InvalidSchedule inside the sender's transaction, which
    rolls the payment back. It should be refused by cancel_on() itself (or be cut to fit,
    as the API and admin actors are)."""
    paid = Signal()  # a signal of this test's own: nothing else is connected to it
    try:
        cancel_on(paid, Thing.expire, sender=Thing, name="n" * 150)
    except (TypeError, ValueError):
        return  # refused where it was given: fine
    job = schedule(thing.expire, in_=60)
    with transaction.atomic():  # the payment, with the auto-cancel job waiting
        Thing.objects.filter(pk=thing.pk).update(state="paid")
        paid.send(sender=Thing, instance=thing)
    assert Thing.objects.get(pk=thing.pk).state == "paid"
    assert Job.objects.get(pk=job.pk).status == Status.CANCELLED


# -- 7. schedule_many: the same built job twice ---------------------------------------------


def test_schedule_many_refuses_the_same_job_twice_with_a_documented_error(redis_client):
    """schedule_many([job, job]) fails with the database's IntegrityError (UNIQUE
    constraint on id), not TypeError/InvalidSchedule; the door (door.check_built) checks
    each job's values but not that the batch holds each job once."""
    job = build_job(tasks.echo, in_=60, args=[1])
    with pytest.raises(Exception) as info:  # noqa: PT011
        schedule_many([job, job])
    assert not isinstance(info.value, DatabaseError), repr(info.value)
    assert isinstance(info.value, TypeError | InvalidSchedule)
    assert not Job.objects.exists()


# -- 8. schedule_many: a tagged value whose raw text cannot be stored ----------------------


@pytest.mark.parametrize(
    "raw", ["2030-01-01\x0012:00:00", "2030-01-01\ud80012:00:00"], ids=["NUL", "surrogate"]
)
def test_schedule_many_refuses_a_tagged_datetime_whose_text_cannot_be_stored(redis_client, raw):
    """serialization.check_stored() checks that {"$dt": raw} loads and that the loaded
    datetime could be dumped, but not raw itself: datetime.fromisoformat() takes any
    character as the date/time separator, NUL and lone surrogates included. The text is
    then written as it is; PostgreSQL's jsonb refuses both (a DataError from
    schedule_many), SQLite stores text that build_job would never have written."""
    job = build_job(tasks.echo, in_=60, args=[1])
    job.args = [{"$dt": raw}]
    refused_cleanly(lambda: schedule_many([job]), redis_client)


# -- 9. the API's key filter trims the key it is given --------------------------------------


def test_the_api_filters_keys_exactly_as_docs_api_md_says(thing):
    """docs/api.md: `queue`, `action`, `key` filter "exactly". schedule() stores a key
    with surrounding spaces as it is, but JobFilterSerializer.key is a DRF CharField with
    trim_whitespace=True: ?key=k%20 finds the job keyed "k" and never the one keyed "k "."""
    from .test_rest_helpers import client_for, make_user, url

    spaced = schedule(thing.touch, in_=60, key="k ")
    plain = schedule(thing.expire, in_=60, key="k")
    api = client_for(make_user(superuser=True))
    found = api.get(url("jobs"), {"key": "k "}).json()["results"]
    assert [job["id"] for job in found] == [str(spaced.pk)], (plain.pk, found)


# -- 10. a @delayable method of a model with a composite primary key ------------------------


class Pair(models.Model):
    """Django 5.2's CompositePrimaryKey: ``pk`` is a tuple. A table of this test's own
    (created and dropped by the test; no migration)."""

    pk = models.CompositePrimaryKey("a", "b")
    a = models.IntegerField()
    b = models.IntegerField()
    touched = models.IntegerField(default=0)

    class Meta:
        app_label = "testapp"

    @delayable
    def touch(self) -> None:
        Pair.objects.filter(pk=self.pk).update(touched=models.F("touched") + 1)


@pytest.fixture
def pair_table():
    with connection.schema_editor() as editor:
        editor.create_model(Pair)
    yield
    with connection.schema_editor() as editor:
        editor.delete_model(Pair)


@pytest.fixture(scope="module", autouse=True)
def _forget_pair():
    yield
    apps.all_models["testapp"].pop("pair", None)
    apps.clear_cache()


def test_a_method_of_a_composite_pk_model_is_refused_or_runs(pair_table, redis_client):
    """describe() takes any saved Model instance; build_job stores str(instance.pk),
    '(1, 2)'. The worker's resolve() then runs _base_manager.filter(pk='(1, 2)'), which
    Django refuses ("'exact' lookup of 'pk' must be a tuple or a list"): the job can
    never run and goes dead. schedule() should refuse it (TypeError/InvalidSchedule) or
    the worker should find the row."""
    from .test_rest_helpers import burst

    pair = Pair.objects.create(a=1, b=2)
    try:
        job = schedule(pair.touch, in_=0)
    except (TypeError, ValueError):
        return  # refused at the door: fine
    burst()
    job.refresh_from_db()
    assert job.status == Status.SUCCEEDED, job.last_error.strip().splitlines()[-1:]
    assert Pair.objects.get(a=1, b=2).touched == 1


# -- 11. run_delayworker --metrics-host that cannot be encoded --------------------------------


@pytest.mark.parametrize("host", ["\u00e9" * 70, "caf\u00e9..example"])
def test_run_delayworker_refuses_an_unusable_metrics_host_with_a_command_error(host):
    """start_metrics() turns OSError into CommandError ("cannot listen on"), but a host
    name that IDNA cannot encode (a label of more than 63 characters once encoded, an
    empty label) makes socket.bind raise TypeError("encoding of hostname failed"), which
    escapes the command as a traceback."""
    from django.core.management import CommandError, call_command

    pytest.importorskip("prometheus_client")
    with pytest.raises(CommandError, match="metrics"):
        call_command("run_delayworker", "--burst", "-v", "0", "--metrics-port", "0",
                     "--metrics-host", host)  # fmt: skip


# -- 12. the admin's link to a target whose primary key the admin quotes -------------------


class Sku(models.Model):
    """A model with a text primary key (a table of this test's own, no migration)."""

    code = models.CharField(max_length=40, primary_key=True)

    class Meta:
        app_label = "testapp"

    @delayable
    def touch(self) -> None:
        pass


@pytest.fixture
def sku_admin(settings):
    """Sku registered on the admin site (as test_admin.py's thing_admin does for Thing)."""
    import sys
    import types

    from django.contrib import admin
    from django.urls import path

    with connection.schema_editor() as editor:
        editor.create_model(Sku)
    admin.site.register(Sku)
    urls = types.ModuleType("delayjobs_audit_sku_urls")
    urls.urlpatterns = [path("admin/", admin.site.urls)]  # type: ignore[attr-defined]
    sys.modules[urls.__name__] = urls
    settings.ROOT_URLCONF = urls.__name__
    yield
    admin.site.unregister(Sku)
    del sys.modules[urls.__name__]
    with connection.schema_editor() as editor:
        editor.delete_model(Sku)


@pytest.fixture(scope="module", autouse=True)
def _forget_sku():
    yield
    apps.all_models["testapp"].pop("sku", None)
    apps.clear_cache()


def test_the_admin_links_a_job_to_its_target_whatever_its_primary_key(sku_admin, admin_client):
    """display.target_url() reverses the target's change URL with the raw pk; the admin
    unquotes object ids (django.contrib.admin.utils.unquote: '_25' is '%', '_5F' is '_'),
    so the link of a job on Sku 'sku_25off' opens 'sku%off', which does not exist (the
    admin redirects with "doesn't exist"). Django's own links use admin.utils.quote()."""
    import re

    sku = Sku.objects.create(code="sku_25off")
    job = schedule(sku.touch, in_=60)
    page = admin_client.get(reverse("admin:django_delayjobs_job_change", args=[job.pk]))
    assert page.status_code == 200
    links = set(re.findall(r'href="([^"]*/testapp/sku/[^"]*/change/)"', page.content.decode()))
    (link,) = links
    target = admin_client.get(link)
    assert target.status_code == 200, (link, target.status_code)
