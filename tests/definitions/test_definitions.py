"""Lease definitions: four layers, field ownership, fail-closed loading, inline rules, cache."""

from __future__ import annotations

import itertools

import pymongo.errors
import pytest

import leases
from leases.definitions import layers as config, model as definitions
from leases.definitions.model import FIELD_OWNERS, document_path, load
from leases.revocation import handlers
from leases.store import client as store

LAYER_AT = {"system": ("_vance", "_tenant"), "tenant": ("acme", "_tenant"), "project": ("acme", "p1")}
FIELD_YAML = {
    "levels.global": ("levels: {{global: {v}}}", "levels", "global"),
    "levels.tenant": ("levels: {{tenant: {v}}}", "levels", "tenant"),
    "levels.project": ("levels: {{project: {v}}}", "levels", "project"),
    "levels.user": ("levels: {{user: {v}}}", "levels", "user"),
    "ttlSeconds": ("ttlSeconds: {v}", "ttlSeconds", None),
    "waitMs": ("waitMs: {v}", "waitMs", None),
    "shares.tenants": ("shares: {{tenants: {{acme: {v}}}}}", None, None),
    "shares.projects": ("shares: {{projects: {{p1: {v}}}}}", None, None),
    "priorities": ("priorities: [c{v}, low]", None, None),
    "maxStarvationMs": ("maxStarvationMs: {v}", None, None),
}


def value_of(definition, field):
    if field.startswith("levels."):
        return definition.levels.get(field.split(".", 1)[1])
    return {"ttlSeconds": definition.ttl_seconds, "waitMs": definition.wait_ms, "resource": definition.resource,
            "shares.tenants": definition.tenant_shares.get("acme"),
            "shares.projects": definition.project_shares.get("p1"),
            "priorities": int(definition.priorities[0][1:]) if definition.priorities else None,
            "maxStarvationMs": definition.max_starvation_ms}[field]


def raw_put(layer, name, text):
    # Raw write (bypasses put_document's validation) to store what an older writer or an
    # operator with direct database access could have left behind.
    tenant, project = LAYER_AT[layer]
    store.config_documents().update_one(
        {"tenantId": tenant, "projectId": project, "path": document_path(name)},
        {"$set": {"text": text}}, upsert=True)
    definitions.cache.clear()


@pytest.mark.parametrize("field,layer", list(itertools.product(FIELD_YAML, ("system", "tenant", "project"))))
def test_ownership_matrix_for_every_field_and_stored_layer(field, layer):
    # given: the bundled tex default (global 6, tenant 3, project 1, ttl 120, wait 10000)
    base = load("tex", "acme", "p1")
    template = FIELD_YAML[field][0]
    # when: the layer sets the field to a distinctive value
    config.put_document(*LAYER_AT[layer], document_path("tex"), template.format(v=77))
    merged = load("tex", "acme", "p1")
    # then: it wins exactly when the layer owns the field, and is silently ignored otherwise
    if layer in FIELD_OWNERS[field]:
        assert value_of(merged, field) == 77
        assert merged.sources[field] == layer
    else:
        assert value_of(merged, field) == value_of(base, field)
    # and a field the layer may not own is reported as ignored, never applied
    text = template.format(v=77)
    assert config.ignored_fields(*LAYER_AT[layer], document_path("tex"), text) == (
        [] if layer in FIELD_OWNERS[field] else [field])


@pytest.mark.parametrize("layer", ["system", "tenant", "project"])
def test_resource_ownership(layer):
    config.put_document(*LAYER_AT[layer], document_path("tex"), "resource: private-res")
    merged = load("tex", "acme", "p1")
    assert merged.resource == ("private-res" if layer in FIELD_OWNERS["resource"] else "tex2pdf")


def test_most_specific_allowed_layer_wins_and_sources_are_reported():
    config.put_document("_vance", "_tenant", document_path("tex"), "levels: {global: 10, project: 2}\nttlSeconds: 50")
    config.put_document("acme", "_tenant", document_path("tex"), "levels: {global: 99, tenant: 4, project: 3}")
    config.put_document("acme", "p1", document_path("tex"), "levels: {tenant: 99, user: 1}\nwaitMs: 5")
    merged = load("tex", "acme", "p1")
    assert merged.levels == {"global": 10, "tenant": 4, "project": 3, "user": 1}
    assert (merged.ttl_seconds, merged.wait_ms, merged.resource) == (50, 5, "tex2pdf")
    assert merged.sources["levels.global"] == "system"
    assert merged.sources["levels.tenant"] == "tenant"
    assert merged.sources["levels.user"] == "project"
    assert merged.sources["resource"] == "classpath"
    # another project of the same tenant does not see p1's layer
    assert load("tex", "acme", "p2").levels == {"global": 10, "tenant": 4, "project": 3}


@pytest.mark.parametrize("text", [
    "levels: {project: [1",            # broken YAML
    "levels: {project: many}",         # non-numeric
    "levels: {project: '3'}",          # quoted number is a string
    "levels: {project: 0}",            # cap < 1
    "levels: {user: -1}",
    "levels: {project: true}",         # bool is not a number
    "ttlSeconds: fast",
    "levles: {project: 1}",            # misspelt key: fail closed
    "name: other",                     # name must match the file
    "- a\n- b",                        # not a mapping
])
@pytest.mark.parametrize("layer", ["system", "tenant", "project"])
def test_broken_layer_fails_closed_and_nothing_is_cached(layer, text):
    raw_put(layer, "tex", text)
    from leases.definitions import invalidation
    invalidation.wait_listening()
    with pytest.raises(leases.LeaseUnavailable):
        definitions.resolve("tex", "acme", "p1")
    assert ("acme", "p1", "tex") not in definitions.cache._entries
    with pytest.raises(leases.LeaseUnavailable):
        leases.acquire(leases.LeaseRequest(type="tex-t", lease="tex", tenant_id="acme", project_id="p1", user_id="u"))


@pytest.fixture(autouse=True)
def _handler():
    class H(handlers.LeaseHandler):
        type = "tex-t"

        def on_revoked(self, holder):
            pass

    handlers.register_handler(H())
    yield
    handlers.unregister_handler("tex-t")


def test_unreadable_layer_fails_closed(monkeypatch):
    def boom(*a, **kw):
        raise pymongo.errors.ServerSelectionTimeoutError("down")

    monkeypatch.setattr(type(store.config_documents()), "find", boom)
    with pytest.raises(leases.LeaseUnavailable):
        definitions.resolve("tex", "acme", "p1")
    assert not definitions.cache._entries


def test_put_document_refuses_broken_yaml_and_writes_nothing():
    with pytest.raises(leases.InvalidDefinition):
        config.put_document("acme", "p1", document_path("tex"), "levels: {project: 0}")
    with pytest.raises(leases.InvalidDefinition):
        config.put_document("acme", "p1", "_vance/config/lease/../x.yaml", "ttlSeconds: 1")
    with pytest.raises(leases.InvalidLeaseRequest):
        config.put_document({"$gt": ""}, "p1", document_path("tex"), "ttlSeconds: 1")
    assert store.config_documents().count_documents({}) == 0


@pytest.mark.parametrize("name", ["a/b", "..", "../tex", "$where", "x" * 65, "tëx", "", "-lead", "a b", "a.b", 5, "tex\n"])
def test_bad_lease_names_are_refused(name):
    with pytest.raises(leases.InvalidLeaseRequest):
        leases.acquire(leases.LeaseRequest(type="tex-t", lease=name, tenant_id="acme", project_id="p1", user_id="u"))
    assert store.holders().count_documents({}) == 0
    assert store.counters().count_documents({}) == 0


@pytest.mark.parametrize("field, bad", [
    *((field, bad) for field in ("tenant_id", "project_id")
      for bad in ["$gt", "a.b", "a\x00b", "", "a/b", "a|b", "ü", "x" * 65, {"$gt": ""}, None, 7]),
    # User ids are Django usernames or emails (tests/engine/test_user_ids.py): only these are no user id.
    *(("user_id", bad) for bad in ["a\x00b", "", "a b", "x" * 151, {"$gt": ""}, None, 7]),
])
def test_bad_ids_are_refused_and_nothing_is_written(field, bad):
    values = {"tenant_id": "acme", "project_id": "p1", "user_id": "u1", field: bad}
    with pytest.raises(leases.InvalidLeaseRequest):
        leases.acquire(leases.LeaseRequest(type="tex-t", lease="tex", **values))
    assert store.holders().count_documents({}) == 0
    assert store.counters().count_documents({}) == 0


def test_inline_definition_uses_a_project_private_counter():
    request = leases.LeaseRequest(type="tex-t", inline={"name": "shell", "levels": {"project": 1, "user": 1}, "ttlSeconds": 30},
                                  tenant_id="acme", project_id="p1", user_id="u1")
    lease = leases.acquire(request)
    assert lease.resource == "mcp-inline:acme/p1/shell"
    assert lease.levels == ["mcp-inline:acme/p1/shell|user|acme/u1", "mcp-inline:acme/p1/shell|project|acme/p1"]
    lease.release()


@pytest.mark.parametrize("inline,fragment", [
    ({"levels": {"project": 1}}, "name"),
    ({"name": "x", "resource": "tex2pdf", "levels": {"project": 1}}, "resource"),
    ({"name": "x", "levels": {"global": 100}}, "levels.global"),
    ({"name": "x", "levels": {"tenant": 100}}, "levels.tenant"),
    ({"name": "x", "levels": {"project": 0}}, "levels.project"),
    ({"name": "x", "levels": {"project": 1}, "colour": "red"}, "unknown"),
    ({"name": "../x", "levels": {"project": 1}}, "name"),
    ("levels: {}", "mapping"),
])
def test_inline_restrictions(inline, fragment):
    with pytest.raises(leases.InvalidDefinition) as err:
        leases.acquire(leases.LeaseRequest(type="tex-t", inline=inline, tenant_id="acme", project_id="p1", user_id="u1"))
    assert fragment in str(err.value)
    assert store.counters().count_documents({}) == 0


def test_local_invalidation_on_change_and_system_write_drops_name_everywhere():
    from leases.definitions import invalidation
    assert invalidation.wait_listening()
    assert definitions.resolve("tex", "acme", "p1").levels["project"] == 1
    assert definitions.resolve("tex", "globex", "q1").levels["project"] == 1
    assert ("acme", "p1", "tex") in definitions.cache._entries
    config.put_document("acme", "p1", document_path("tex"), "levels: {project: 2}")
    assert ("acme", "p1", "tex") not in definitions.cache._entries
    assert ("globex", "q1", "tex") in definitions.cache._entries
    assert definitions.resolve("tex", "acme", "p1").levels["project"] == 2
    config.put_document("_vance", "_tenant", document_path("tex"), "levels: {global: 2}")
    assert not [k for k in definitions.cache._entries if k[2] == "tex"]
    assert definitions.resolve("tex", "globex", "q1").levels["global"] == 2
    assert config.delete_document("_vance", "_tenant", document_path("tex")) is True
    assert definitions.resolve("tex", "globex", "q1").levels["global"] == 6


# --- reserved layer ids and field attribution -----------------------------------------------

def test_given_only_a_tenant_document_when_merged_tenant_wide_then_its_fields_are_the_tenant_layers():
    # Given the bundled browser default and only acme/_tenant/browser.yaml stored
    config.put_document("acme", "_tenant", document_path("browser"), "levels: {tenant: 2, user: 1}\nttlSeconds: 45")
    # When the merge is seen tenant-wide (project _tenant: no project layer)
    merged = load("browser", "acme", "_tenant")
    # Then the stored fields are explained by the tenant layer, none by a project layer
    assert (merged.ttl_seconds, merged.levels) == (45, {"global": 20, "tenant": 2, "user": 1})
    assert merged.sources == {"ttlSeconds": "tenant", "levels.tenant": "tenant", "levels.user": "tenant",
                              "levels.global": "classpath", "resource": "classpath", "waitMs": "classpath",
                              "fence": "classpath"}


def test_given_the_system_document_when_merged_as_the_system_tenant_then_it_is_the_system_layer_only():
    config.put_document("_vance", "_tenant", document_path("browser"), "levels: {global: 3, user: 1}\nttlSeconds: 9")
    merged = load("browser", "_vance", "_tenant")
    assert merged.levels == {"global": 3, "tenant": 5, "user": 1}  # tenant 5: bundled
    assert {merged.sources[f] for f in ("levels.global", "levels.user", "ttlSeconds")} == {"system"}


@pytest.mark.parametrize("field, reserved", [("tenant_id", "_vance"), ("project_id", "_tenant"),
                                             ("tenant_id", "_tenant"), ("project_id", "_vance")])
def test_given_a_reserved_layer_id_when_checked_as_a_request_id_then_refused(field, reserved):
    from leases.ids import validation

    with pytest.raises(leases.InvalidLeaseRequest, match="reserved"):
        validation.request_id(reserved, field)
    # The layer code keeps addressing its documents with them.
    assert validation.entity_id(reserved, field) == reserved
    assert validation.request_id("acme", field) == "acme"


@pytest.mark.parametrize("values", [dict(tenant_id="_vance", project_id="p1"), dict(tenant_id="acme", project_id="_tenant")])
def test_given_a_reserved_layer_id_in_a_python_request_then_it_is_refused_and_nothing_written(values):
    from leases.revocation import handlers as _handlers

    class _H(_handlers.LeaseHandler):
        type = "reserved-t"

        def on_revoked(self, holder):
            pass

    _handlers.register_handler(_H())
    try:
        with pytest.raises(leases.InvalidLeaseRequest, match="reserved"):
            leases.acquire(leases.LeaseRequest(type="reserved-t", lease="tex", user_id="u1", **values))
    finally:
        _handlers.unregister_handler("reserved-t")
    assert store.counters().count_documents({}) == 0 and store.holders().count_documents({}) == 0


@pytest.mark.parametrize("text", [
    "shares: {tenants: {acme: 0}}",
    "shares: {tenants: {acme: -2}}",
    "shares: {tenants: {acme: yes}}",
    "shares: {tenants: {'a.b': 1}}",
    "shares: {tenants: [acme]}",
    "shares: {users: {u1: 2}}",
    "priorities: []",
    "priorities: [Interactive]",
    "priorities: [a, a]",
    "priorities: [a, b]\ndefaultPriority: c",
    "maxStarvationMs: 0",
    "priorities: [a]\nallowedPriorities: {acme: [z]}",
])
def test_broken_share_or_class_fields_in_the_system_layer_fail_closed(text):
    raw_put("system", "tex", text)
    with pytest.raises(leases.LeaseUnavailable):
        definitions.resolve("tex", "acme", "p1")
    with pytest.raises(leases.InvalidDefinition):
        config.validate_document("_vance", "_tenant", document_path("tex"), text)


def test_classes_default_to_the_lowest_and_a_restricted_tenant_is_refused_not_downgraded():
    config.put_document("_vance", "_tenant", document_path("tex"),
                        "priorities: [interactive, batch]\nallowedPriorities: {globex: [batch]}\nmaxStarvationMs: 2000")
    acme = load("tex", "acme", "p1")
    assert acme.priority_of("acme", None) == (1, "batch")
    assert acme.priority_of("acme", "interactive") == (0, "interactive")
    assert load("tex", "globex", "p1").classes_for("globex") == ("batch",)
    with pytest.raises(leases.PriorityNotAllowed):
        acme.priority_of("globex", "interactive")
    with pytest.raises(leases.InvalidLeaseRequest):
        acme.priority_of("acme", "urgent")
    assert acme.to_dict()["priorities"] == ["interactive", "batch"] and acme.to_dict()["maxStarvationMs"] == 2000


# --- the cache is told whether it may serve ---------------------------------------------------


def loads_of(cache, times=2):
    """How many of ``times`` reads of (acme, p1, tex) through ``cache`` went to MongoDB."""
    from tests.helpers import counted_commands

    with counted_commands() as counter:
        for _ in range(times):
            cache.get("tex", "acme", "p1")
    return counter.commands.count("find")


def age(cache, seconds):
    """Make every entry of ``cache`` ``seconds`` older than it is."""
    cache._entries = {k: e._replace(cached_at=e.cached_at - seconds) for k, e in cache._entries.items()}


def test_given_a_cache_never_told_it_is_live_then_it_serves_an_entry_only_while_younger_than_the_bound():
    from leases.conf import lease_settings

    bound = int(lease_settings.INVALIDATION_LIVENESS_MS) / 1000.0
    cache = definitions.DefinitionCache(definitions.load)
    assert cache.live_epoch() is None
    # A load holds every change made before it: served for the bound, as a proof would be.
    assert loads_of(cache, times=1) >= 1 and loads_of(cache) == 0
    # when: the entry is as old as the bound
    age(cache, bound)
    # then: the next read loads the layers again, and the fresh entry serves the one after
    assert loads_of(cache, times=1) >= 1 and loads_of(cache, times=1) == 0


def test_given_a_cache_told_live_until_a_deadline_then_it_serves_until_then_and_not_after():
    import time

    cache = definitions.DefinitionCache(definitions.load)
    cache.live_until(7, time.monotonic() + 60)
    assert cache.live_epoch() == 7
    first = loads_of(cache, times=1)
    assert first >= 1 and loads_of(cache) == 0  # served from the entry
    # when: the proof's deadline passes without a new one, and the entry is older than the bound
    cache.live_until(7, time.monotonic() - 0.001)
    age(cache, 60)
    # then: the next read goes to the layers again
    assert cache.live_epoch() is None and loads_of(cache, times=1) >= 1


def test_given_a_new_epoch_then_entries_of_the_old_one_are_never_served():
    import time

    cache = definitions.DefinitionCache(definitions.load)
    cache.live_until(1, time.monotonic() + 60)
    cache.get("tex", "acme", "p1")
    cache.live_until(2, time.monotonic() + 60)
    assert loads_of(cache, times=1) >= 1 and cache._entries[("acme", "p1", "tex")].epoch == 2


def test_given_a_lost_subscription_then_the_cache_is_emptied_and_serves_nothing():
    import time

    cache = definitions.DefinitionCache(definitions.load)
    cache.live_until(3, time.monotonic() + 60)
    cache.get("tex", "acme", "p1")
    cache.not_live()
    assert not cache._entries and cache.live_epoch() is None and loads_of(cache, times=1) >= 1


def test_given_a_forked_child_then_it_does_not_serve_on_its_parents_proof():
    import os
    import time

    cache = definitions.DefinitionCache(definitions.load)
    cache.live_until(5, time.monotonic() + 60)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running any cleanup of the parent's
        os.write(write_end, b"none" if cache.live_epoch() is None else b"live")
        os._exit(0)
    os.close(write_end)
    try:
        answer = os.read(read_end, 16)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    assert answer == b"none"
    assert cache.live_epoch() == 5  # the parent still is


def test_given_many_threads_missing_one_entry_together_then_one_of_them_loads_it_for_all():
    import threading
    import time

    calls = []

    def slow_load(name, tenant_id, project_id):
        calls.append(name)
        time.sleep(0.2)  # the others arrive while it loads
        return definitions.load(name, tenant_id, project_id)

    cache = definitions.DefinitionCache(slow_load)
    cache.live_until(1, time.monotonic() + 60)
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get("tex", "acme", "p1"))) for _ in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(results) == 20 and len(calls) == 1
    assert {r.to_dict()["levels"]["global"] for r in results} == {results[0].to_dict()["levels"]["global"]}


def test_given_a_change_applied_while_a_load_is_in_flight_then_the_threads_waiting_for_it_load_again():
    import threading
    import time

    calls = []
    loading = threading.Event()

    def slow_load(name, tenant_id, project_id):
        calls.append(name)
        loading.set()
        time.sleep(0.3)
        return definitions.load(name, tenant_id, project_id)

    cache = definitions.DefinitionCache(slow_load)
    cache.live_until(1, time.monotonic() + 60)
    leader = threading.Thread(target=lambda: cache.get("tex", "acme", "p1"))
    leader.start()
    assert loading.wait(5)
    follower = threading.Thread(target=lambda: cache.get("tex", "acme", "p1"))
    follower.start()
    time.sleep(0.05)
    # when: a change to the definition is applied while the first load is in flight
    cache.invalidate("acme", "p1", "tex")
    leader.join(10)
    follower.join(10)
    # then: the follower did not take the load that may predate the change, and nothing was stored
    assert len(calls) == 2 and ("acme", "p1", "tex") not in cache._entries
