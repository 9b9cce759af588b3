"""Signals in: cancel an object's waiting jobs when one of your signals fires."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.dispatch import Signal

from .door import check_column
from .models import JobEvent
from .registry import BoundAction, DelayableMethod, describe
from .serialization import check_text
from .services import cancel_for


def cancel_on(
    signal: Signal,
    action: Any = None,
    *,
    sender: Any = None,
    instance_kwarg: str = "instance",
    name: str = "",
    fail_if_running: bool = False,
) -> Any:
    """Connect a receiver that cancels ``action``'s waiting jobs on the signal's instance.

    The receiver runs inside the sender's transaction, so the cancel commits or rolls
    back with it. With ``fail_if_running``, the receiver raises ``AlreadyRunning`` when such a
    job has already started, which rolls the sender's transaction back. Call this from an
    ``AppConfig.ready()``. Returns the receiver. ``instance_kwarg="sender"``: the object
    is the signal's sender (``order_paid.send(sender=order)``).
    """
    # Checked now, not when the signal fires inside the sender's transaction.
    if not isinstance(signal, Signal):
        raise TypeError(f"signal must be a django.dispatch.Signal, not {type(signal).__name__}")
    if not isinstance(instance_kwarg, str):
        raise TypeError(f"instance_kwarg must be a str, not {type(instance_kwarg).__name__}")
    if instance_kwarg == "signal":  # Django's own keyword: the Signal, never the object
        raise TypeError("instance_kwarg cannot be 'signal': Django sends the Signal under it")
    if instance_kwarg == "sender" and sender is not None:  # it would never match the object
        raise TypeError("instance_kwarg='sender' takes no sender=: the object is the sender")
    if not isinstance(fail_if_running, bool):
        raise TypeError(f"fail_if_running must be a bool, not {type(fail_if_running).__name__}")
    actor = check_column(f"signal:{name}" if name else "signal", "the actor 'signal:' + name",
                         "actor", JobEvent)  # fmt: skip
    if isinstance(action, str):
        check_text(action, "action")
    elif action is not None and not isinstance(action, DelayableMethod):
        describe(action)  # NotDelayable for a callable that is not a registered action

    def receiver(sender: Any, **kwargs: Any) -> None:
        # "sender": the object sent as the sender (signal.send(sender=order))
        instance = sender if instance_kwarg == "sender" else kwargs.get(instance_kwarg)
        if instance is None:
            raise TypeError(f"cancel_on: the signal was sent without {instance_kwarg}=")
        cancel_for(instance, action, actor=actor, fail_if_running=fail_if_running)

    # The same call again (an AppConfig.ready() run twice) gives the same receiver, so it
    # is connected once; other options give a receiver of their own. No dispatch_uid: the
    # receiver returned must disconnect as any other, signal.disconnect(receiver, sender).
    # Ids, as Django's own lookup keys; the entry holds the objects, so no id is reused.
    # The action by its text, or by the id of the method (a bound one's, which cancel_for
    # takes whoever it is bound to): not its repr, the same for methods of two models of
    # one class name.
    method = action.method if isinstance(action, BoundAction) else action
    what = method if isinstance(method, str) else id(method)
    key = (id(signal), what, id(sender), instance_kwarg, actor, fail_if_running)
    connected = _receivers.setdefault(key, (signal, action, sender, receiver))[3]
    signal.connect(connected, sender=sender, weak=False)  # already connected: nothing
    return connected


_receivers: dict[tuple[Any, ...], tuple[Any, Any, Any, Callable[..., None]]] = {}
