"""Inputs that were silently ignored or waited on for ever: ``--metrics-host`` without a
metrics port, and an embedded server's start-up time-out that is not a finite positive
number of seconds."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from django_delayjobs import schedule
from django_delayjobs.embedded import EmbeddedRedis
from django_delayjobs.embedded_cluster import EmbeddedCluster, Node
from django_delayjobs.models import Job, Status
from tests.testapp import tasks

burst = pytest.mark.django_db(transaction=True)  # the worker commits as it would


@burst
@pytest.mark.parametrize("host", ["0.0.0.0", "10.1.2.3", "::1"])
def test_a_metrics_host_without_a_metrics_port_is_refused_before_anything_runs(host):
    """Without ``--metrics-port`` no metrics port is opened: the host would be ignored,
    and the operator believe the metrics served where they are not."""
    job = schedule(tasks.record, in_=0, args=["x"])
    with pytest.raises(CommandError, match="--metrics-host needs --metrics-port") as raised:
        call_command("run_delayworker", "--burst", "-v", "0", "--metrics-host", host)
    assert raised.value.returncode == 2  # as argparse's refusals
    assert Job.objects.get(pk=job.pk).status == Status.SCHEDULED  # nothing ran


@burst
def test_the_default_metrics_host_alone_still_runs():
    job = schedule(tasks.record, in_=0, args=["x"])
    call_command("run_delayworker", "--burst", "-v", "0")
    assert Job.objects.get(pk=job.pk).status == Status.SUCCEEDED


class Sly(float):
    """A float whose sums are ``nan``: the deadline would never pass."""

    def __radd__(self, other: object) -> float:
        return math.nan


BAD_TIMEOUTS = [math.nan, math.inf, -1, 0, "10", None, True, 10**400, -(10**5000), 3601,
                Fraction(7201, 2), Sly(math.nan)]  # fmt: skip
IDS = ["nan", "inf", "-1", "0", "str", "None", "True", "10**400", "-10**5000",
       "over an hour", "Fraction", "a float subclass"]  # fmt: skip


@pytest.mark.parametrize("timeout", BAD_TIMEOUTS, ids=IDS)
def test_an_embedded_redis_refuses_a_timeout_it_would_wait_on_for_ever(tmp_path, timeout):
    """``nan`` never compares past a deadline: the start would wait for ever on a server
    that does not answer. Refused before any server is started."""
    server = EmbeddedRedis(tmp_path / "r")
    with pytest.raises((TypeError, ValueError), match="timeout"):
        server.start(timeout=timeout)
    assert server.process is None


@pytest.mark.parametrize("timeout", BAD_TIMEOUTS, ids=IDS)
def test_an_embedded_cluster_refuses_a_timeout_it_would_wait_on_for_ever(tmp_path, timeout):
    cluster = EmbeddedCluster(directory=tmp_path / "c")
    with pytest.raises((TypeError, ValueError), match="timeout"):
        cluster.start(timeout=timeout)
    assert cluster.nodes == []


@pytest.mark.parametrize("timeout", [1, 0.5, Fraction(3, 2), 3600], ids=repr)
def test_an_embedded_redis_takes_any_number_of_seconds_up_to_an_hour(tmp_path, timeout):
    server = EmbeddedRedis(tmp_path / "r")
    try:
        assert server.start(timeout=timeout) == server.url
    finally:
        server.close()


@pytest.mark.parametrize("timeout", BAD_TIMEOUTS[:3], ids=IDS[:3])
def test_a_cluster_s_waits_refuse_such_a_timeout_too(tmp_path, timeout):
    cluster = EmbeddedCluster(directory=tmp_path / "c")
    with pytest.raises((TypeError, ValueError), match="timeout"):
        cluster.wait_healthy(timeout=timeout)
    with pytest.raises((TypeError, ValueError), match="timeout"):
        cluster.restart(Node(1, tmp_path / "n"), timeout=timeout)  # before it spawns one
