"""ORM mappings of the collections the lease engine writes with pymongo.

The engine (``leases.store.client`` and friends) owns the documents; these models exist for the
admin and read-side views. ``db_column`` values are the exact MongoDB field names.

Only :class:`ConfigDocument` is managed (its collection and unique index come from the
migration); the engine creates the other collections and their indexes itself.
"""

from django.db import models
from django_mongodb_backend.fields import ArrayField


class ConfigDocument(models.Model):
    """A tenant/project lease-configuration document (YAML text) at ``path``."""

    tenant_id = models.CharField(max_length=64, db_column="tenantId")
    project_id = models.CharField(max_length=64, db_column="projectId")
    path = models.CharField(max_length=255)
    text = models.TextField(blank=True)
    updated_at = models.DateTimeField(auto_now=True, db_column="updatedAt")

    class Meta:
        db_table = "lease_config_documents"
        ordering = ["tenant_id", "project_id", "path"]
        constraints = [
            # Same keys and name as the engine's ensure_indexes(), so either side creating
            # it first is fine (MongoDB rejects an equal index under a different name).
            models.UniqueConstraint(
                fields=["tenant_id", "project_id", "path"], name="tenant_project_path"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant_id}/{self.project_id}:{self.path}"


class Holder(models.Model):
    """One live lease (a holder of capacity). ``_id`` is the lease token."""

    token = models.CharField(primary_key=True, max_length=128, db_column="_id")
    state = models.CharField(max_length=32, blank=True, default="")
    resource = models.CharField(max_length=255, blank=True, default="")
    lease_name = models.CharField(max_length=255, db_column="leaseName", blank=True, default="")
    type = models.CharField(max_length=255, blank=True, default="")
    tenant_id = models.CharField(max_length=64, db_column="tenantId", null=True, blank=True)
    project_id = models.CharField(max_length=64, db_column="projectId", null=True, blank=True)
    user_id = models.CharField(max_length=255, db_column="userId", null=True, blank=True)
    holder_ref = models.CharField(max_length=255, db_column="holderRef", null=True, blank=True)
    pod = models.CharField(max_length=255, null=True, blank=True)
    pod_bound = models.BooleanField(db_column="podBound", default=False)
    levels = ArrayField(models.CharField(max_length=255), null=True, blank=True)
    payload = models.JSONField(null=True, blank=True)
    ttl_seconds = models.IntegerField(db_column="ttlSeconds", null=True, blank=True)
    acquired_at = models.DateTimeField(db_column="acquiredAt", null=True, blank=True)
    last_seen_at = models.DateTimeField(db_column="lastSeenAt", null=True, blank=True)
    expires_at = models.DateTimeField(db_column="expiresAt", null=True, blank=True)

    class Meta:
        managed = False
        db_table = "resource_lease_holders"
        ordering = ["-acquired_at"]

    def __str__(self) -> str:
        return f"{self.resource} <- {self.token}"


class Counter(models.Model):
    """Booked count of a resource at one level/scope. ``_id`` is the counter key."""

    key = models.CharField(primary_key=True, max_length=512, db_column="_id")
    resource = models.CharField(max_length=255, blank=True, default="")
    level = models.CharField(max_length=255, blank=True, default="")
    scope = models.CharField(max_length=64, blank=True, default="")
    tenant_id = models.CharField(max_length=64, db_column="tenantId", null=True, blank=True)
    count = models.IntegerField(default=0)
    cap = models.IntegerField(null=True, blank=True)
    updated_at = models.DateTimeField(db_column="updatedAt", null=True, blank=True)

    class Meta:
        managed = False
        db_table = "resource_lease_counters"
        ordering = ["key"]

    def __str__(self) -> str:
        return self.key


class Pod(models.Model):
    """A registered process/pod that holds pod-bound leases. ``_id`` is the pod id."""

    pod_id = models.CharField(primary_key=True, max_length=255, db_column="_id")
    endpoint = models.CharField(max_length=1024, null=True, blank=True)
    lease_id = models.CharField(max_length=255, db_column="leaseId", null=True, blank=True)
    interval_seconds = models.IntegerField(db_column="intervalSeconds", null=True, blank=True)
    expiry_deadline = models.DateTimeField(db_column="expiryDeadline", null=True, blank=True)
    last_receipt_at = models.DateTimeField(db_column="lastReceiptAt", null=True, blank=True)
    registered_at = models.DateTimeField(db_column="registeredAt", null=True, blank=True)
    stopped = models.BooleanField(default=False)
    stopped_at = models.DateTimeField(db_column="stoppedAt", null=True, blank=True)

    class Meta:
        managed = False
        db_table = "lease_pods"
        ordering = ["pod_id"]

    def __str__(self) -> str:
        return self.pod_id
