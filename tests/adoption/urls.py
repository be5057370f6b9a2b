from django.contrib import admin
from django.urls import include, path

from . import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("compile/", views.compile_view),
    path("hold/", views.hold_view),
    path("internal/lease/", include("leases.api.internal_urls")),  # pod-to-pod revocations
    path("", include("leases.api.key_urls")),  # /t/<tenant>/insights/api-keys
    path("", include("insights.urls")),  # /t/<tenant>/insights/leases
]
