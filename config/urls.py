from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", include("leases.api.pod_urls")),  # /internal/lease/…: pod-to-pod and operator CLI, shared secret
    path("api/v1/", include("leases.api.v1_urls")),  # HTTP lease protocol, bearer API keys
    path("", include("leases.api.key_urls")),  # /t/<tenant>/insights/api-keys (tenant admins)
    path("", include("django_prometheus.urls")),  # /metrics
    path("", include("insights.urls")),
]

# A request Django refuses before any view (a bad Host header) answers problem+json on the API.
handler400 = "leases.api.problems.bad_request"
