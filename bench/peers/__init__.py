"""One adapter module per system for ``bench/compare.py``.

Worker processes import these modules too, so this package imports nothing eagerly.
"""

SYSTEMS = {
    "delayjobs": "peers.delayjobs_peer",
    "celery": "peers.celery_peer",
    "rq": "peers.rq_peer",
    "huey": "peers.huey_peer",
    "dramatiq": "peers.dramatiq_peer",
}
