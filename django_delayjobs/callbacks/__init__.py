"""HTTP callbacks: ``schedule_http`` stores a request in an ordinary job whose action,
``django_delayjobs.callbacks.deliver``, sends it signed, to where the policy allows.

Modules, one concept each: ``policy`` (URL form, allowlist, address rules, the resolver
seam), ``headers``, ``request`` (what a row stores), ``config`` (the ``HTTP_*``
settings), ``signing`` (Standard Webhooks, both sides, no Django), ``delivery`` (one
urllib3 exchange), ``outcome`` (a response as success, retry or give-up), ``action`` (the
registered action), ``service`` (``schedule_http``), ``receiving`` (Django views that
verify). Nothing is imported here, so ``signing`` stays usable without Django.
"""
