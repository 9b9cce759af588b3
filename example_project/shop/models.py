"""An order that cancels itself unless it is paid in time."""

from __future__ import annotations

import logging
import uuid
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from django_delayjobs import delayable, schedule, schedule_http
from django_delayjobs.exceptions import AlreadyRunning
from django_delayjobs.models import Job

from .signals import order_paid

logger = logging.getLogger("shop")


class PaymentRefused(Exception):
    """The order cannot be paid: it is cancelled, being cancelled, or already paid."""


def new_number() -> str:
    return f"ORD-{uuid.uuid4().hex[:10].upper()}"


class Order(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        PAID = "paid"
        CANCELLED = "cancelled"

    number = models.CharField(max_length=40, unique=True, default=new_number)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(default=timezone.now)
    paid_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    cancel_reason = models.CharField(max_length=100, blank=True, default="")

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["-created_at", "-id"], name="shop_order_newest")]

    def __str__(self) -> str:
        return f"{self.number} ({self.status})"

    @property
    def auto_cancel_key(self) -> str:
        return f"order-{self.pk}-autocancel"

    @property
    def reminder_key(self) -> str:
        return f"order-{self.pk}-reminder"

    # -- placing an order -----------------------------------------------------------------

    @classmethod
    def place(
        cls,
        amount: Decimal,
        *,
        number: str | None = None,
        cancel_in: float | timedelta | None = None,
        cancel_at: datetime | None = None,
        remind: bool = True,
    ) -> Order:
        """Create an order, schedule its auto-cancel and its payment reminder, in one
        transaction.

        The auto-cancel is due ``cancel_in`` (default ``SHOP_AUTO_CANCEL_SECONDS``) from
        now, or at ``cancel_at``: it is ``order.auto_cancel_job``. With ``remind``, halfway
        there a signed HTTP callback to the shop's own endpoint reminds the customer: it
        is ``order.reminder_job`` (None for an order due at once: no time to remind).
        """
        with transaction.atomic():
            order = cls.objects.create(amount=amount, number=number or new_number())
            if cancel_in is None and cancel_at is None:
                cancel_in = settings.SHOP_AUTO_CANCEL_SECONDS
            order.auto_cancel_job = schedule(
                order.cancel, in_=cancel_in, at=cancel_at, key=order.auto_cancel_key
            )
            if remind:
                order.reminder_job = order.schedule_reminder(order.auto_cancel_job.run_at)
        return order

    def schedule_reminder(self, deadline: datetime) -> Job | None:
        """A payment reminder halfway to ``deadline``: a POST to the shop's own
        ``/hooks/payment-reminder/`` (the destination ``shop`` of ``HTTP_DESTINATIONS``),
        signed, and never sent after the deadline. None if the deadline has passed."""
        now = timezone.now()
        if deadline <= now:  # a reminder due after its own expiry: schedule_http refuses it
            return None
        return schedule_http(
            "shop:/hooks/payment-reminder/",
            json={"order": self.number, "deadline": deadline.isoformat()},
            at=now + (deadline - now) / 2,
            expires=deadline,
            key=self.reminder_key,
        )

    def remind(self, webhook_id: str) -> bool:
        """Remind the customer if the order still waits for its payment; True if so.

        A real shop would send an e-mail here and record ``webhook_id``, so that a second
        delivery of the same callback (they come at least once) sends no second e-mail.
        This one only logs. (It could write to the database, on SQLite too: the callback's
        action is not atomic, so no transaction is open while its request is in flight;
        docs/callbacks.md, "Limits to know".)
        """
        self.refresh_from_db(fields=["status"])
        if self.status != Order.Status.PENDING:
            return False
        logger.info("payment reminder for order %s (webhook-id %s)", self.number, webhook_id)
        return True

    # -- the delayed action ------------------------------------------------------------------

    @delayable
    def cancel(self, reason: str = "unpaid") -> str:
        """Cancel the order if it is still pending (the worker runs this at the deadline).

        An action must re-check the state it acts on: lock the row and look again.
        """
        with transaction.atomic():
            order = Order.objects.select_for_update().get(pk=self.pk)
            if order.status != Order.Status.PENDING:
                return "left alone"
            order.status = Order.Status.CANCELLED
            order.cancelled_at = timezone.now()
            order.cancel_reason = reason[:100]
            order.save(update_fields=["status", "cancelled_at", "cancel_reason"])
        self.status, self.cancelled_at = order.status, order.cancelled_at
        return "cancelled"

    # -- paying ----------------------------------------------------------------------------

    def pay(self) -> None:
        """Mark the order paid; its auto-cancel is cancelled in the same transaction.

        Raises ``PaymentRefused`` when the order was cancelled, when its auto-cancel job is
        running right now (the deadline has passed: the cancel wins), or when it is already
        paid. Nothing is changed then.
        """
        with transaction.atomic():
            order = Order.objects.select_for_update().get(pk=self.pk)
            if order.status == Order.Status.CANCELLED:
                raise PaymentRefused(f"order {order.number} was cancelled ({order.cancel_reason})")
            if order.status == Order.Status.PAID:
                raise PaymentRefused(f"order {order.number} is already paid")
            order.status = Order.Status.PAID
            order.paid_at = timezone.now()
            order.save(update_fields=["status", "paid_at"])
            # The receiver (see ShopConfig.ready) cancels the waiting auto-cancel job. If a
            # worker already claimed it at the deadline (it is waiting for our row lock to
            # cancel this order), the receiver raises AlreadyRunning: the cancel wins and
            # the payment rolls back.
            try:
                order_paid.send(sender=Order, instance=order)
            except AlreadyRunning as exc:
                raise PaymentRefused(f"order {order.number} is being cancelled: too late") from exc
        self.status, self.paid_at = order.status, order.paid_at
