from django.contrib import admin
from django.urls import include, path

from . import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("compile/", views.compile_view),
    path("acompile/", views.acompile_view),
    path("hold/", views.hold_view),
    path("work/", views.work_view),
    path("", include("leases.api.pod_urls")),  # /internal/lease/…: pod-to-pod and operator CLI
    path("api/v1/", include("leases.api.v1_urls")),  # the HTTP lease API for other languages, API keys
    path("", include("leases.api.key_urls")),  # /t/<tenant>/insights/api-keys
    path("", include("insights.urls")),  # /t/<tenant>/insights/leases
    # /metrics: with PROMETHEUS_MULTIPROC_DIR set for every process of the host, the counts of all
    # of them (this web process, the Celery worker's pool children), not only this process's.
    path("", include("django_prometheus.urls")),
]

# A request Django refuses before any view (a bad Host header) answers problem+json on the API.
handler400 = "leases.api.problems.bad_request"
