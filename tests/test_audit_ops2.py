"""Audit ops2: failing tests for the bugs found (moved to their modules once fixed)."""

from __future__ import annotations

import io
import re
import urllib.request

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_the_metrics_port_listens_on_the_ipv6_loopback(host):
    """docs/metrics.md names ::1 among the loopback addresses --metrics-host takes without
    a token; the server was IPv4 only, so the command refused it ("cannot listen")."""
    pytest.importorskip("prometheus_client")
    out = io.StringIO()
    call_command("run_delayworker", "--burst", "-v", "1", "--metrics-port", "0",
                 "--metrics-host", host, stdout=out)  # fmt: skip
    assert re.search(r"delayjobs metrics: http://\[::1\]:\d+/metrics", out.getvalue())
    from django_delayjobs.metrics.server import MetricsServer

    server = MetricsServer(host, 0).start()
    try:
        url = f"http://[::1]:{server.port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200
            assert b"delayjobs_jobs_total" in response.read()
    finally:
        server.close()
