"""Tenants, their projects, and who may see them (memberships with a role).

A tenant's ``slug`` is the ``tenantId`` the lease engine stores on holders and counters,
so it follows the engine's id rules (``leases.ids.validation.ID_RE``); a leading underscore is
refused because ``_vance`` / ``_tenant`` are the reserved ids of the config layers.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models

from leases.ids.validation import ID_RE


def validate_slug_id(value: str) -> None:
    """Django field validator: ``value`` must be usable as an engine tenant/project id.

    Raises:
        ValidationError: not matching ``ID_RE`` or starting with the reserved ``_``.
    """
    if not isinstance(value, str) or ID_RE.fullmatch(value) is None:
        raise ValidationError(
            "Use 1-64 characters: letters, digits, '_' or '-'.", code="invalid_slug"
        )
    if value.startswith("_"):
        raise ValidationError("A leading '_' is reserved for system layers.", code="reserved_slug")


class Tenant(models.Model):
    """A customer; ``slug`` is its ``tenantId`` in every lease document."""

    slug = models.CharField(max_length=64, unique=True, validators=[validate_slug_id])
    name = models.CharField(max_length=200)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return f"{self.name} ({self.slug})"


class Project(models.Model):
    """A project of a tenant; ``slug`` is its ``projectId`` in lease documents."""

    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="projects")
    slug = models.CharField(max_length=64, validators=[validate_slug_id])
    name = models.CharField(max_length=200, blank=True)

    class Meta:
        # Plain-field orderings only: joins ($lookup) are avoided on the embedded server.
        ordering = ["tenant_id", "slug"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "slug"], name="insights_project_tenant_slug"),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.slug}"


class Membership(models.Model):
    """A user's role in a tenant; only ``ADMIN`` sees Insights → Leases."""

    class Role(models.TextChoices):
        ADMIN = "ADMIN", "Admin"
        MEMBER = "MEMBER", "Member"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        ordering = ["tenant_id", "user_id"]
        constraints = [
            models.UniqueConstraint(fields=["user", "tenant"], name="insights_membership_user_tenant"),
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant.slug}: {self.role}"

    @property
    def is_admin(self) -> bool:
        return self.role == self.Role.ADMIN
