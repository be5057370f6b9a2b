"""The host's tenants are its auth groups; a group's staff members are its admins."""

from django.contrib.auth.models import Group

from leases.tenancy import ADMIN, MEMBER, TenantAccess, TenantGrant


class GroupTenantAccess(TenantAccess):
    def grant(self, user, tenant_id):
        group = user.groups.filter(name=tenant_id).first()
        if group is None:
            return None
        return TenantGrant(slug=group.name, name=group.name.title(), role=ADMIN if user.is_staff else MEMBER)

    def grants(self, user):
        role = ADMIN if user.is_staff else MEMBER
        return [TenantGrant(slug=g.name, name=g.name.title(), role=role) for g in user.groups.order_by("name")]

    def projects(self, tenant_id):
        return ["docs", "reports"] if Group.objects.filter(name=tenant_id).exists() else []

    def tenant_exists(self, tenant_id):
        return Group.objects.filter(name=tenant_id).exists()
