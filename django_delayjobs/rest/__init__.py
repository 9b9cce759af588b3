"""The HTTP API (Django REST framework): ``include("django_delayjobs.rest.urls")``.

Views read rows and call the service verbs (``cancel``, ``reschedule``, ``requeue``) like
any other code; they never write a row or a Redis key themselves.
"""
