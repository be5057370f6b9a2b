"""Admin: tenants, projects and memberships are editable by staff."""

from django.contrib import admin

from .models import Membership, Project, Tenant


class ProjectInline(admin.TabularInline):
    model = Project
    extra = 0


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0
    autocomplete_fields = ("user",)


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("slug", "name")
    search_fields = ("slug", "name")
    inlines = (ProjectInline, MembershipInline)


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("tenant", "slug", "name")
    list_filter = ("tenant",)
    search_fields = ("slug", "name")


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ("user", "tenant", "role")
    list_filter = ("role", "tenant")
    search_fields = ("user__username",)
    autocomplete_fields = ("user",)
