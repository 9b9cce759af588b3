from typing import Any

from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django_delayjobs import cancel_on

        from .models import Order
        from .signals import order_paid

        # Paying an order cancels its waiting auto-cancel job, in the payment's transaction.
        # fail_if_running: a payment that lands while the auto-cancel is already running
        # raises AlreadyRunning and rolls back; the cancel wins.
        cancel_on(order_paid, Order.cancel, sender=Order, name="order_paid", fail_if_running=True)
        # ... and its payment reminder, if it has not been sent yet (an HTTP callback has
        # no target object: it is found by its key).
        order_paid.connect(cancel_reminder, sender=Order, dispatch_uid="shop.cancel_reminder")


def cancel_reminder(sender: object, instance: Any, **kwargs: Any) -> None:
    from django_delayjobs.callbacks.service import active_callback

    job = active_callback(instance.reminder_key)
    if job is not None:
        job.cancel(actor="signal:order_paid")
