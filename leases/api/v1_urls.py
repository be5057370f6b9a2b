"""URLs of the HTTP lease protocol, mounted at ``/api/v1/`` by ``config.urls``."""

from django.urls import path

from . import v1_views

app_name = "api_v1"

urlpatterns = [
    path("openapi.json", v1_views.openapi_document, name="openapi"),
    path("leases", v1_views.acquire, name="acquire"),
    path("leases/<str:token>", v1_views.release, name="release"),
    path("leases/<str:token>/renew", v1_views.renew, name="renew"),
    path("leases/<str:token>/payload", v1_views.payload, name="payload"),
    path("tickets/<str:ticket_id>", v1_views.ticket, name="ticket"),
]
