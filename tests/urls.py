from django.contrib import admin
from django.urls import include, path

from tests.testapp import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/delayjobs/", include("django_delayjobs.rest.urls")),
    path("delayjobs/", include("django_delayjobs.urls")),
    path("hooks/receive/", views.receive),
    path("hooks/receive-async/", views.receive_async),
]
