from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("delayjobs/", include("django_delayjobs.urls")),  # health/ and metrics/
    path("", include("shop.urls")),
]
