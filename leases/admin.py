"""Admin: configuration documents are editable; engine-owned collections are read-only."""

from django import forms
from django.contrib import admin, messages

from .definitions import layers as config
from .errors import LeaseError
from .models import ConfigDocument, Counter, Holder, Pod


class ConfigDocumentForm(forms.ModelForm):
    """Refuses a document the engine would fail closed on, before it is stored."""

    class Meta:
        model = ConfigDocument
        fields = ("tenant_id", "project_id", "path", "text")
        widgets = {"text": forms.Textarea(attrs={"rows": 16, "cols": 80, "style": "font-family: monospace"})}

    def clean(self):
        data = super().clean()
        try:
            config.validate_document(data.get("tenant_id"), data.get("project_id"), data.get("path"), data.get("text", ""))
        except LeaseError as exc:
            raise forms.ValidationError(f"{exc.code}: {exc}") from None
        return data


@admin.register(ConfigDocument)
class ConfigDocumentAdmin(admin.ModelAdmin):
    form = ConfigDocumentForm
    list_display = ("tenant_id", "project_id", "path", "updated_at")
    list_filter = ("tenant_id",)
    search_fields = ("tenant_id", "project_id", "path")
    readonly_fields = ("updated_at",)

    # Every admin write is a document change event: every process drops the affected
    # cached definitions, exactly as after leases.definitions.layers.put_document().
    def save_model(self, request, obj, form, change):
        previous = None
        if change and obj.pk is not None:
            previous = ConfigDocument.objects.filter(pk=obj.pk).values_list("tenant_id", "project_id", "path").first()
        super().save_model(request, obj, form, change)
        try:
            note = config.ignored_note(obj.tenant_id, obj.project_id, obj.path, obj.text)
        except LeaseError:
            note = ""
        if note:
            self.message_user(request, note, level=messages.WARNING)
        if previous is not None and previous != (obj.tenant_id, obj.project_id, obj.path):
            config.changed(*previous)
        config.changed(obj.tenant_id, obj.project_id, obj.path)

    def delete_model(self, request, obj):
        super().delete_model(request, obj)
        config.changed(obj.tenant_id, obj.project_id, obj.path)

    def delete_queryset(self, request, queryset):
        documents = list(queryset.values_list("tenant_id", "project_id", "path"))
        super().delete_queryset(request, queryset)
        for document in documents:
            config.changed(*document)


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
