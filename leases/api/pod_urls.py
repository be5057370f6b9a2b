"""Everything a pod serves to other pods and to the operator CLI: ``/internal/lease/…``.

A root URLconf of its own, so a process without a web server (a Celery worker) can serve
exactly these routes and nothing else; a web project includes it at its root.
"""

from django.urls import include, path

# Used only where this is the root URLconf (a worker's internal server): a machine client
# gets a JSON error, and the project's HTML error pages (which link to its other apps) are
# never rendered there.
handler404 = "leases.api.internal_auth.not_found"
handler500 = "leases.api.internal_auth.server_error"

urlpatterns = [
    path("internal/lease/admin/", include("leases.api.admin_urls")),  # operator CLI -> pod
    path("internal/lease/", include("leases.api.internal_urls")),  # pod -> pod
]
