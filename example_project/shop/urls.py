from django.urls import path

from . import views

app_name = "shop"
urlpatterns = [
    path("", views.order_list, name="order_list"),
    path("orders/", views.create_order, name="create_order"),
    path("orders/<int:pk>/pay/", views.pay_order, name="pay_order"),
    path("hooks/payment-reminder/", views.payment_reminder, name="payment_reminder"),
]
