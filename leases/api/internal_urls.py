"""Internal (pod-to-pod) routes, mounted at ``/internal/lease/``."""

from django.urls import path

from . import internal_views

app_name = "internal_lease"

urlpatterns = [
    path("revoked", internal_views.revoked, name="revoked"),
]
