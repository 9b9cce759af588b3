from django.contrib import admin

from .models import Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ["number", "amount", "status", "created_at", "paid_at", "cancelled_at"]
    list_filter = ["status"]
    search_fields = ["number"]
    readonly_fields = ["status", "created_at", "paid_at", "cancelled_at", "cancel_reason"]
    date_hierarchy = "created_at"
