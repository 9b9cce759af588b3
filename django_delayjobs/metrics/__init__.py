"""Metrics: what every worker process did, aggregated in Redis for the whole deployment.

``recorder`` tallies outcomes in memory on the hot path and flushes them to Redis about
once a second; ``store`` is their Redis layout; ``exposition`` renders them (with the
queues' state) in the Prometheus text format; ``views`` and ``server`` serve that.
Only ``exposition``, ``views`` and ``server`` need ``prometheus_client`` (the
``metrics`` extra), and they import it when they run, not at import time.
"""

from __future__ import annotations

from .recorder import flush, last_flush, record

__all__ = ["flush", "last_flush", "record"]
