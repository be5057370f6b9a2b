"""Admin: configuration documents are editable; engine-owned collections are read-only."""

from django.contrib import admin

from .models import ConfigDocument, Counter, Holder, Pod


@admin.register(ConfigDocument)
class ConfigDocumentAdmin(admin.ModelAdmin):
    list_display = ("tenant_id", "project_id", "path", "updated_at")
    list_filter = ("tenant_id",)
    search_fields = ("tenant_id", "project_id", "path")
    readonly_fields = ("updated_at",)


class ReadOnlyAdmin(admin.ModelAdmin):
    """Viewable by staff with the view permission; never added, changed or deleted here."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    def get_readonly_fields(self, request, obj=None):
        return [field.name for field in self.model._meta.fields]


@admin.register(Holder)
class HolderAdmin(ReadOnlyAdmin):
    list_display = (
        "token", "state", "resource", "lease_name", "type", "tenant_id", "project_id",
        "user_id", "pod", "pod_bound", "levels", "acquired_at", "expires_at",
    )
    list_filter = ("state", "resource")
    search_fields = ("token", "resource", "tenant_id", "project_id", "user_id")


@admin.register(Counter)
class CounterAdmin(ReadOnlyAdmin):
    list_display = ("key", "resource", "level", "scope", "tenant_id", "count", "cap", "updated_at")
    list_filter = ("resource", "level")
    search_fields = ("key", "resource", "tenant_id")


@admin.register(Pod)
class PodAdmin(ReadOnlyAdmin):
    list_display = (
        "pod_id", "endpoint", "lease_id", "interval_seconds", "expiry_deadline",
        "last_receipt_at", "registered_at", "stopped", "stopped_at",
    )
    list_filter = ("stopped",)
    search_fields = ("pod_id", "endpoint")
