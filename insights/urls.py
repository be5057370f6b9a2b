"""Routes of the tenant UI: login/logout, the start page and Insights → Leases."""

from django.contrib.auth import views as auth_views
from django.urls import path

from . import history_views, share_views, views

app_name = "insights"

urlpatterns = [
    path("", views.home, name="home"),
    # The app's own template: a host project has no registration/login.html to lend it.
    path("accounts/login/", auth_views.LoginView.as_view(template_name="insights/login.html", next_page="insights:home",
                                                         redirect_authenticated_user=True), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(next_page="insights:login"), name="logout"),
    path("t/<str:tenant>/insights/leases", views.holders, name="holders"),
    path("t/<str:tenant>/insights/leases/counters", views.counters, name="counters"),
    path("t/<str:tenant>/insights/leases/waiting", views.waiting, name="waiting"),
    path("t/<str:tenant>/insights/leases/definition", views.definition, name="definition"),
    path("t/<str:tenant>/insights/leases/audit/<str:entry_id>", views.audit_entry, name="audit"),
    path("t/<str:tenant>/insights/leases/shares", share_views.shares_view, name="shares"),
    path("t/<str:tenant>/insights/leases/history", history_views.history_view, name="history"),
    path("t/<str:tenant>/insights/leases/holders/<str:token>", views.holder_detail, name="holder"),
    path("t/<str:tenant>/insights/leases/holders/<str:token>/revoke", views.revoke, name="revoke"),
]
