"""The guards' one contract (leases.fencing), run against both: FenceGuard on a collection of
the embedded server, RedisFenceGuard on the real Redis."""

from __future__ import annotations

import threading
import uuid

import pytest
import redis

import leases
from leases.definitions import layers as config
from leases.definitions.model import document_path
from leases.errors import InvalidFence, LeaseError, StaleFence
from leases.fencing import FenceGuard, RedisFenceGuard
from leases.store import fence_codec
from leases.telemetry import metrics
from tests.helpers import quiet_handler_fixture

handler = quiet_handler_fixture()
REDIS_URL = "redis://127.0.0.1:6379/14"
KEY = "tex2pdf|global|*"


@pytest.fixture(params=["mongo", "redis"])
def kind(request):
    return request.param


@pytest.fixture
def make_guard(kind, mongo_db):
    """Builds guards of ``kind`` sharing one store (the collection, or one key prefix)."""
    if kind == "mongo":
        collection = mongo_db["resource_fences"]
        yield lambda resource="tex2pdf": FenceGuard(collection, resource=resource)
        return
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"test-fence:{uuid.uuid4().hex}:"
    yield lambda resource="tex2pdf": RedisFenceGuard(redis.Redis.from_url(REDIS_URL), prefix, resource=resource)
    for key in client.scan_iter(match=prefix + "*"):
        client.delete(key)


@pytest.fixture
def guard(make_guard):
    return make_guard()


def fence(generation, slot=0, counter=KEY):
    return fence_codec.encode(counter, slot, generation)


def rejected(resource="tex2pdf"):
    return metrics.FENCE_REJECTED.labels(resource=resource)._value.get()


def test_given_a_live_holder_then_it_is_admitted_as_often_as_it_asks(guard):
    for _ in range(3):
        guard.admit(fence(5))


def test_given_a_newer_grant_of_the_slot_admitted_then_the_older_fence_is_refused_and_counted(guard):
    guard.admit(fence(5))
    guard.admit(fence(7))
    before = rejected()
    with pytest.raises(StaleFence) as err:
        guard.admit(fence(5))
    assert err.value.code == "STALE_FENCE" and isinstance(err.value, LeaseError)
    assert (err.value.counter, err.value.slot, err.value.generation, err.value.seen) == (KEY, 0, 5, 7)
    assert rejected() == before + 1
    # The newer holder stays admitted: the refusal wrote nothing.
    guard.admit(fence(7))


def test_given_cap_holders_on_distinct_slots_then_none_refuses_another(guard):
    # Slot 1's holder is older than slot 0's: still live, still admitted.
    guard.admit(fence(9, slot=0))
    guard.admit(fence(3, slot=1))
    guard.admit(fence(2, slot=0, counter="tex2pdf|tenant|acme"))
    guard.admit(fence(9, slot=0))


def test_given_a_refusal_then_the_label_is_the_guards_resource_whatever_the_fence_names(make_guard):
    mine = make_guard(resource="browser")
    mine.admit(fence(5, counter="evil\nlabel|global|*"))
    mine.admit(fence(6, counter="evil\nlabel|global|*"))
    before = rejected("browser")
    with pytest.raises(StaleFence):
        mine.admit(fence(5, counter="evil\nlabel|global|*"))
    assert rejected("browser") == before + 1


@pytest.mark.parametrize("bad", [
    None, 5, b"1.YQ.0.1", "", "garbage", "2.YQ.0.1", "1.YQ.0", "1.YQ.00.1", "1.YQ.0.01", "1.YQ.0.0",
    "1.YQ.-1.1", "1.YQ==.0.1", "1.Y.0.1", "1..0.1", f"1.YQ.0.{2**63}", f"1.YQ.{10**9}.1",
    "1.YQ.0.1\n", "1." + "Q" * 2000 + ".0.1", "1.YQ.0.1 ", "1.gA.0.1",
])
def test_given_a_malformed_fence_then_it_is_refused_as_invalid_and_nothing_is_recorded(guard, bad):
    with pytest.raises(InvalidFence) as err:
        guard.admit(bad)
    assert err.value.code == "INVALID_FENCE"
    # Nothing recorded: the oldest possible fence of that counter is still admitted.
    guard.admit(fence(1, counter="a"))


def test_given_a_bad_resource_label_then_the_guard_is_not_built(make_guard):
    with pytest.raises(InvalidFence):
        make_guard(resource="no spaces {here}")


def test_given_many_threads_admitting_the_same_fence_at_once_then_every_one_passes(make_guard):
    # The first admit of a slot creates its record: simultaneous creators must not refuse each other.
    guards = [make_guard() for _ in range(8)]
    barrier = threading.Barrier(len(guards))
    errors: list[Exception] = []

    def admit(g):
        barrier.wait()
        try:
            g.admit(fence(42, slot=3))
        except Exception as exc:  # noqa: BLE001 - collected, asserted below
            errors.append(exc)

    threads = [threading.Thread(target=admit, args=(g,)) for g in guards]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert errors == []


def test_given_concurrent_admits_of_many_generations_then_the_highest_wins_and_no_older_passes_after_it(make_guard):
    # Given: 12 threads, each admitting its own generation of one slot, in parallel.
    guards = [make_guard() for _ in range(12)]
    barrier = threading.Barrier(len(guards))
    outcome: dict[int, str] = {}

    def admit(g, generation):
        barrier.wait()
        try:
            g.admit(fence(generation, slot=1))
            outcome[generation] = "admitted"
        except StaleFence:
            outcome[generation] = "stale"

    threads = [threading.Thread(target=admit, args=(g, n)) for n, g in enumerate(guards, start=1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    # Then: the newest generation always passes; what passes and fails after it is ordered.
    assert outcome[12] == "admitted"
    assert set(outcome) == set(range(1, 13))
    check = make_guard()
    check.admit(fence(12, slot=1))
    for generation in range(1, 12):
        with pytest.raises(StaleFence):
            check.admit(fence(generation, slot=1))


def test_given_real_grants_then_the_guard_refuses_the_holder_whose_slot_was_granted_again(guard):
    # Given: a cap-1 resource; a holder admitted, then its lease ends (here: released).
    config.put_document("_vance", "_tenant", document_path("tex"), "levels: {global: 1}")
    request = leases.LeaseRequest(type="test", lease="tex", tenant_id="acme", project_id="p1", user_id="u1")
    old = leases.acquire(request)
    guard.admit(old.fence)
    old.release()
    # When: the slot is granted again and its new holder uses the resource.
    new = leases.acquire(request)
    guard.admit(new.fence)
    # Then: the old holder is refused; the new one keeps being admitted.
    with pytest.raises(StaleFence):
        guard.admit(old.fence)
    guard.admit(new.fence)
    new.release()
