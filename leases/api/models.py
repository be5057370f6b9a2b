"""API keys: per-tenant (optionally per-project) bearer credentials, stored hashed.

The plaintext key is ``vlk_<prefix>_<secret>``; only ``prefix`` (the public id shown in
lists) and the SHA-256 of the whole key are stored. The secret carries 256 bits of
randomness, so a plain (unsalted, fast) hash is enough: nothing can be guessed offline.
"""

from django.db import models


class ApiKey(models.Model):
    """One API key of a tenant; ``project_id`` set means it is bound to that project."""

    tenant_id = models.CharField(max_length=64, db_column="tenantId")
    project_id = models.CharField(max_length=64, db_column="projectId", null=True, blank=True)
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64, db_column="secretHash")
    created_at = models.DateTimeField(auto_now_add=True, db_column="createdAt")
    created_by = models.CharField(max_length=150, db_column="createdBy", blank=True, default="")
    revoked_at = models.DateTimeField(null=True, blank=True, db_column="revokedAt")
    revoked_by = models.CharField(max_length=150, db_column="revokedBy", blank=True, default="")

    class Meta:
        db_table = "api_keys"
        ordering = ["tenant_id", "-created_at"]
        indexes = [models.Index(fields=["tenant_id", "created_at"], name="api_keys_tenant_created")]

    def __str__(self) -> str:
        scope = f"{self.tenant_id}/{self.project_id}" if self.project_id else self.tenant_id
        return f"{self.name} ({self.prefix}) @ {scope}"
