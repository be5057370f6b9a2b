"""Smoke tests for the project foundation: pymongo access, ORM + admin, /metrics."""

import datetime as dt

import pytest


def test_mongo_db_insert_find(mongo_db):
    assert mongo_db.name == "test_leases"
    mongo_db["smoke"].insert_one({"_id": "a", "n": 1})
    assert mongo_db["smoke"].find_one({"_id": "a"}) == {"_id": "a", "n": 1}


def test_collections_start_empty(mongo_db):
    # The previous test's document is gone; migrated reference data is kept.
    assert mongo_db["smoke"].count_documents({}) == 0
    assert mongo_db["django_content_type"].count_documents({}) > 0


@pytest.mark.django_db(transaction=True)
def test_orm_and_admin(client, mongo_db):
    from django.contrib.auth import get_user_model

    from leases.models import ConfigDocument, Counter, Holder

    doc = ConfigDocument.objects.create(
        tenant_id="acme", project_id="docs", path="lease/tex.yaml", text="name: tex\n"
    )
    stored = mongo_db["lease_config_documents"].find_one({"_id": doc.pk})
    assert stored["tenantId"] == "acme" and stored["projectId"] == "docs"
    assert isinstance(stored["updatedAt"], dt.datetime)

    now = dt.datetime.now(dt.UTC).replace(tzinfo=None, microsecond=0)
    mongo_db["resource_lease_holders"].insert_one({
        "_id": "tok-123", "state": "HELD", "resource": "tex", "leaseName": "tex", "type": "tex",
        "tenantId": "acme", "projectId": "docs", "userId": "alice", "holderRef": "job-1",
        "pod": "pod-a", "podBound": True, "levels": ["global:tex", "tenant:acme:tex"],
        "payload": {"jobId": "j1", "nested": {"n": 1}}, "ttlSeconds": 30,
        "acquiredAt": now, "lastSeenAt": now, "expiresAt": now + dt.timedelta(seconds=30),
    })
    mongo_db["resource_lease_counters"].insert_one({
        "_id": "tex|tenant|acme", "resource": "tex", "level": "tenant", "scope": "tenant",
        "tenantId": "acme", "count": 1, "cap": 4, "updatedAt": now,
    })
    holder = Holder.objects.get(pk="tok-123")
    assert holder.levels == ["global:tex", "tenant:acme:tex"]
    assert holder.payload == {"jobId": "j1", "nested": {"n": 1}}
    assert holder.pod_bound is True and holder.expires_at.tzinfo is not None
    assert Counter.objects.get(pk="tex|tenant|acme").cap == 4

    user = get_user_model().objects.create_superuser("admin", "admin@example.com", "pw")
    client.force_login(user)
    assert client.get("/admin/").status_code == 200
    for url, needle in [
        ("/admin/leases/configdocument/", "lease/tex.yaml"),
        ("/admin/leases/holder/", "tok-123"),
        ("/admin/leases/counter/", "tex|tenant|acme"),
        ("/admin/leases/pod/", "0 pods"),
        ("/admin/leases/holder/tok-123/change/", "job-1"),
        (f"/admin/leases/configdocument/{doc.pk}/change/", "name: tex"),
    ]:
        response = client.get(url)
        assert response.status_code == 200, url
        assert needle in response.content.decode(), url
    # Engine-owned collections are read-only in the admin.
    assert client.get("/admin/leases/holder/add/").status_code == 403


def test_metrics(client):
    response = client.get("/metrics")
    assert response.status_code == 200
    assert "django_http_requests_before_middlewares_total" in response.content.decode()
