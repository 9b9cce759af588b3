"""Plain Django views: list orders, create one, pay one; and the endpoint that receives
the shop's own signed payment-reminder callbacks."""

import json
from decimal import Decimal, InvalidOperation

from django.contrib import messages
from django.contrib.contenttypes.models import ContentType
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from django_delayjobs.callbacks.receiving import verify_webhook
from django_delayjobs.models import Job

from .models import Order, PaymentRefused

AMOUNT = Order._meta.get_field("amount")
#: The first amount that ``Order.amount`` (max_digits, decimal_places) cannot hold.
TOO_MUCH = 10 ** (AMOUNT.max_digits - AMOUNT.decimal_places)  # type: ignore[attr-defined]


@require_GET
def order_list(request: HttpRequest) -> HttpResponse:
    orders = list(Order.objects.all()[:50])  # the newest, by the index on created_at
    # Their auto-cancel jobs, found by their target (an index; the job table keeps every
    # finished job until it is pruned, and only an active job's key is in an index).
    jobs = Job.objects.filter(
        target_type=ContentType.objects.get_for_model(Order),
        target_id__in=[str(order.pk) for order in orders],
        key__in=[order.auto_cancel_key for order in orders],
    )
    deadlines = {
        job.target_id: job for job in jobs.order_by().only("target_id", "run_at", "status")
    }
    rows = [(order, deadlines.get(str(order.pk))) for order in orders]
    return render(request, "shop/order_list.html", {"rows": rows})


@require_POST
def create_order(request: HttpRequest) -> HttpResponse:
    try:
        amount = Decimal(request.POST.get("amount", "")).quantize(Decimal("0.01"))
        if not amount.is_finite() or amount <= 0:
            raise InvalidOperation
        AMOUNT.run_validators(amount)  # what the column holds (SQLite stores more)
    except (InvalidOperation, ValidationError):
        messages.error(
            request, f"The amount must be a positive number below {TOO_MUCH:,}, e.g. 19.90."
        )
        return redirect("shop:order_list")
    order = Order.place(amount)
    job = order.auto_cancel_job
    messages.success(
        request,
        f"Order {order.number} created; it is cancelled at {job.run_at:%H:%M:%S} UTC unless paid.",
    )
    return redirect("shop:order_list")


@require_POST
def pay_order(request: HttpRequest, pk: int) -> HttpResponse:
    order = get_object_or_404(Order, pk=pk)
    try:
        order.pay()
    except PaymentRefused as exc:
        messages.error(request, f"Payment refused: {exc}.")
    else:
        messages.success(request, f"Order {order.number} paid; its auto-cancel is cancelled.")
    return redirect("shop:order_list")


@require_POST
@verify_webhook  # 401 unless signed with one of HTTP_SIGNING_SECRETS; CSRF-exempt
def payment_reminder(request: HttpRequest) -> JsonResponse:
    """A payment reminder is due: remind the customer if the order is still unpaid.

    Answers 2xx whenever retrying cannot help (already paid, already reminded), 404 for an
    order that does not exist (the job ends dead), 400 for a body that is not ours.
    """
    try:
        number = json.loads(request.body)["order"]
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"error": 'expected {"order": <number>}'}, status=400)
    order = Order.objects.filter(number=str(number)).first()
    if order is None:
        return JsonResponse({"error": f"no order {number!r}"}, status=404)
    reminded = order.remind(request.webhook_id)  # type: ignore[attr-defined]
    return JsonResponse({"order": order.number, "reminded": reminded})
