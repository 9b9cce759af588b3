"""``@delayable``: the only way a callable becomes an action a worker may run.

A module-level function is registered under ``"<module>.<qualname>"``. A model method is
marked by a descriptor and stored as (model label, pk, method name); at run time the
model comes from Django's app registry and the method must still carry the mark. Nothing
read from Redis or the database is ever imported by path.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

from .exceptions import InvalidSchedule, NotDelayable, UnknownAction
from .serialization import check_text, short_repr

if TYPE_CHECKING:
    from django.db.models import Model

P = ParamSpec("P")
R = TypeVar("R")

_functions: dict[str, Callable[..., Any]] = {}

#: The longest name of an action: the ``Job.action`` column holds no more.
ACTION_MAX_LENGTH = 255

#: The start of a ``django.tasks`` task's action name (+ its module_path). Here, not in
#: ``backends``, which imports django.tasks: ``services.requeue`` tells a task's job by it.
TASK_PREFIX = "task:"


class DelayableMethod(Generic[R]):
    """A model method marked ``@delayable``; ``instance.method`` binds it."""

    def __init__(self, func: Callable[..., R], atomic: bool = True) -> None:
        self.func = func
        self.name = func.__name__
        self.atomic = atomic
        self.owner: type | None = None
        functools.update_wrapper(self, func)  # type: ignore[arg-type]

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name
        self.owner = owner

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> DelayableMethod[R]: ...
    @overload
    def __get__(self, instance: object, owner: type | None = None) -> BoundAction[R]: ...
    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return BoundAction(self, instance)

    def __repr__(self) -> str:
        return f"<delayable method {self.func.__qualname__}>"


class BoundAction(Generic[R]):
    """``order.cancel`` for a ``@delayable`` method: call it, or pass it to ``schedule``."""

    def __init__(self, method: DelayableMethod[R], instance: Any) -> None:
        self.method = method
        self.instance = instance
        self.delayable_atomic = method.atomic

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        return self.method.func(self.instance, *args, **kwargs)

    def __repr__(self) -> str:
        return f"<delayable {self.method.name} of {instance_name(self.instance)}>"


def instance_name(instance: object) -> str:
    """``Thing 42``: an instance named by its class and primary key, for messages. Not its
    ``repr()``, which calls the model's ``__str__``: one that reads a foreign key not set
    yet (an unsaved instance) raises, and would replace the message's own error."""
    return f"{type(instance).__name__} {short_repr(getattr(instance, 'pk', None))}"


@overload
def delayable(func: Callable[P, R], /) -> Any: ...
@overload
def delayable(*, atomic: bool = True) -> Callable[[Callable[P, R]], Any]: ...
def delayable(func: Callable[P, R] | None = None, /, *, atomic: bool = True) -> Any:
    """Register a module-level function or a model method as an action.

    ``@delayable`` runs the action inside the transaction that records its outcome, so a
    failure or a lost worker rolls its database writes back. ``@delayable(atomic=False)``
    runs it outside any transaction (for an action that only talks to the outside world,
    such as an HTTP call, and must not hold a transaction open meanwhile); its outcome is
    written right after, and it may run more than once if its worker dies in between.
    """
    _check_atomic(atomic)
    if func is None:
        return lambda fn: _mark(fn, atomic)
    return _mark(func, atomic)


def _check_atomic(atomic: object) -> None:
    # Not its truth: atomic="false" would run the action inside the outcome's transaction.
    if not isinstance(atomic, bool):
        raise TypeError(f"atomic must be a bool, not {type(atomic).__name__}")


def _mark(func: Callable[..., Any], atomic: bool) -> Any:
    if not inspect.isfunction(func) or func.__name__ == "<lambda>":
        raise NotDelayable(f"@delayable takes a def-function, not {func!r}")
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        # Calling one runs none of its body: each attempt would make a generator, fail on
        # it as a return value (not JSON), and the job end dead with nothing done.
        raise NotDelayable(
            f"{func.__qualname__} is a generator function (it yields): calling it runs none "
            "of its body; make the action a plain function"
        )
    qualname = func.__qualname__
    if "<locals>" in qualname:
        raise NotDelayable(f"{qualname} is defined inside a function; define it at module level")
    if "." in qualname:  # defined in a class body: a method
        return DelayableMethod(func, atomic)
    name = f"{func.__module__}.{qualname}"
    register(name, func, atomic=atomic)
    func.delayable_name = name  # type: ignore[attr-defined]
    return func


def register(name: str, fn: Callable[..., Any], *, atomic: bool = True) -> None:
    """Register ``fn`` as the action ``name`` (used by the django.tasks backend and the
    HTTP callbacks); ``atomic`` as for ``@delayable``."""
    _check_atomic(atomic)
    _check_name(name)
    if _functions.get(name, fn) is not fn:
        raise NotDelayable(f"an action named {name!r} is already registered")
    fn.delayable_atomic = atomic  # type: ignore[attr-defined]
    _functions[name] = fn


def _check_name(name: object) -> None:
    """Refuse a name no job can store: refused here, when the action is defined, not by
    each ``schedule()`` of it."""
    if not isinstance(name, str) or not name:
        raise NotDelayable(f"an action's name must be a non-empty str, not {short_repr(name)}")
    try:
        check_text(name, f"the action's name {short_repr(name)}", ACTION_MAX_LENGTH)
    except InvalidSchedule as exc:
        raise NotDelayable(f"{exc}: no job could name this action") from None


@dataclass(frozen=True)
class ActionRef:
    """What ``schedule`` stores about an action: its name and, for methods, the target."""

    name: str
    target: Model | None = None


def describe(fn: object) -> ActionRef:
    """Return how to store ``fn``, or raise ``NotDelayable``/``InvalidSchedule``."""
    from django.db.models import Model

    if isinstance(fn, BoundAction):
        instance = fn.instance
        if not isinstance(instance, Model):
            raise NotDelayable(f"{fn!r}: @delayable methods must belong to a Django model")
        if instance.pk is None or instance._state.adding:
            raise InvalidSchedule(
                f"{type(instance).__name__}.{fn.method.name} is bound to an unsaved "
                f"{type(instance).__name__}; save it first"
            )
        check_single_pk(instance)
        check_database(instance)
        return ActionRef(f"{instance._meta.label}.{fn.method.name}", instance)
    name = getattr(fn, "delayable_name", None)
    if name is not None and _functions.get(name) is fn:
        return ActionRef(name)
    if isinstance(fn, DelayableMethod):
        raise NotDelayable(f"{fn!r} is unbound: schedule instance.{fn.name}, not Model.{fn.name}")
    if getattr(fn, "__name__", None) == "<lambda>":
        raise NotDelayable("a lambda cannot be scheduled: it has no stable name to store")
    raise NotDelayable(f"{fn!r} is not registered: decorate it with @delayable")


def check_single_pk(instance: Model) -> None:
    """Raise ``NotDelayable`` if a job cannot name ``instance`` by one primary key value."""
    if instance._meta.is_composite_pk:
        raise NotDelayable(
            f"{type(instance).__name__} has a composite primary key, and a job names its "
            "target by one value: schedule a @delayable function that takes the key's parts"
        )


def check_database(instance: Model) -> None:
    """Raise ``InvalidSchedule`` if a worker would not find ``instance``'s row where it is.

    A worker reads a job's target on ``db_for_write`` of its model with no instance to
    route by, so an instance read from another database (``.using("shard2")``, which no
    router sends this model's writes to) would be looked up by its pk in that one: another
    row, or none.
    """
    from django.db import router

    model = type(instance)
    where, read = router.db_for_write(model, instance=instance), router.db_for_write(model)
    if where != read:
        raise InvalidSchedule(
            f"this {model.__name__} is a row of the database {where!r}, and a worker reads "
            f"{model.__name__} rows on {read!r} (db_for_write of the model): schedule a "
            "@delayable function that takes the pk and reads it there"
        )


def resolve(name: str, target: Model | None) -> Callable[..., Any]:
    """Return the callable a stored job names, or raise ``UnknownAction``."""
    if target is None:
        return _function(name)
    return BoundAction(_method(name, type(target)), target)


def _function(name: str) -> Callable[..., Any]:
    try:
        return _functions[name]
    except KeyError:
        raise UnknownAction(
            f"no @delayable function named {name!r} is registered in this process "
            "(is its module imported by the worker? put it in an app's models.py or "
            "tasks.py)"
        ) from None


def _method(name: str, model: type[Model]) -> DelayableMethod[Any]:
    label, _, attr = name.rpartition(".")
    if label != model._meta.label:
        # The action names its model: a row whose target is of another model (or a proxy
        # the method was not scheduled on) must not run that model's method of the name.
        raise UnknownAction(
            f"{name!r} is a method of {label or 'no model'}, but the job's target is a "
            f"{model._meta.label}: nothing runs"
        )
    for klass in model.__mro__:
        if attr in vars(klass):
            marked = vars(klass)[attr]
            if isinstance(marked, DelayableMethod):
                return marked
            break
    raise UnknownAction(f"{model.__name__}.{attr} is not a @delayable method")


_signature = functools.cache(inspect.signature)  # actions are registered: a few, for good


def check_call(name: str, model: type[Model] | None, args: Any, kwargs: Any) -> None:
    """Raise ``NotDelayable`` unless ``name`` is an action this process runs (a method of
    ``model``'s rows, or a function), and ``TypeError`` unless it takes ``args`` and
    ``kwargs``: what ``schedule()`` refuses, for a job built elsewhere."""
    try:
        func = _function(name) if model is None else _method(name, model).func
    except UnknownAction as exc:
        raise NotDelayable(str(exc)) from None
    check_arguments(func, args, kwargs, method=model is not None)


def check_arguments(func: Callable[..., Any], args: Any, kwargs: Any, *, method: bool) -> None:
    """Raise ``TypeError`` unless ``func`` (a method: after its instance) takes ``args``
    and ``kwargs``."""
    try:
        signature = _signature(func)
        if method:
            signature.bind(None, *args, **kwargs)
        else:
            signature.bind(*args, **kwargs)
    except TypeError as exc:
        raise TypeError(f"the arguments do not fit {func.__qualname__}: {exc}") from None
