"""Internal admin routes, mounted at ``/internal/lease/admin/`` (shared secret, no sessions)."""

from django.urls import path

from . import admin_views

app_name = "internal_lease_admin"

urlpatterns = [
    path("revoke/<str:token>", admin_views.revoke_token, name="revoke"),
    path("revoke-pod/<str:pod>", admin_views.revoke_pod, name="revoke-pod"),
    path("sweep", admin_views.sweep, name="sweep"),
]
