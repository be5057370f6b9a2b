"""Routes of the API-key pages for tenant admins (mounted at ``""`` by ``config.urls``)."""

from django.urls import path

from . import key_views

app_name = "api_keys"

urlpatterns = [
    path("t/<str:tenant>/insights/api-keys", key_views.key_list, name="list"),
    path("t/<str:tenant>/insights/api-keys/<str:prefix>/revoke", key_views.key_revoke, name="revoke"),
]
