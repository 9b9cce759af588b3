"""A receiver of callbacks, as a project would write it (tests/urls.py routes to it)."""

from django.http import HttpRequest, JsonResponse

from django_delayjobs.callbacks.receiving import verify_webhook


@verify_webhook
def receive(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"webhook_id": request.webhook_id, "bytes": len(request.body)})


@verify_webhook(tolerance=5)
async def receive_async(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"webhook_id": request.webhook_id})
