"""Errors raised by the engine. No Django here: the Django layer re-exports them."""


class DelayJobsError(Exception):
    """Base class of every error django-delayjobs raises on purpose."""


class EngineUnavailable(DelayJobsError):
    """Redis could not be reached or answered with an error; nothing was changed."""
