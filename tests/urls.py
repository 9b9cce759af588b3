from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/delayjobs/", include("django_delayjobs.rest.urls")),
    path("delayjobs/", include("django_delayjobs.urls")),
]
