"""The history checker on a real run: six client processes, every fault kind, ≤ 60 s wall.

Three tenants with two processes each on ``levels: {global: 2, tenant: 1}``, TTL 2 s, waitMs
15 s; the test process SIGSTOPs a holder and a waiter (2.6–3.6 s), stops this test's own
store server for just over ``LEASES_MONGO_TIMEOUT_MS`` (1.5 s), ``kill -9``s a client (and
starts a replacement), kills and restarts this test's private Redis, and has a client stall
(stop the world) between a successful check and its use. The verdict comes from the
clients' history alone (:mod:`tests.checker.rules`): proven overlap ≤ cap, no revival,
liveness with W = 12 s and the busy bound longest fault + TTL + 5 s slack. The longer run
is bench/bench_pauses.py.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from leases.definitions import model as definitions
from leases.store import client as store
from leases.store.embedded import start_server
from tests.checker import harness, rules

SLACK_S = 5.0  # busy bound: longest fault + TTL + this (a loaded 2-core machine)
W_S = 12.0  # every live process is granted at least once per 12 s of its live time


@pytest.fixture
def own_store(settings):
    """A store server of this test alone: it gets SIGSTOPped (never the session's shared one)."""
    server = start_server(":memory:")
    settings.MONGODB_URI = server.uri
    settings.LEASES_MONGO_TIMEOUT_MS = harness.RunConfig().mongo_timeout_ms
    store.reset()
    definitions.cache.clear()
    try:
        yield server
    finally:
        if server.process.poll() is None:
            os.kill(server.pid, signal.SIGCONT)
        store.reset()
        server.stop()
        definitions.cache.clear()


def test_given_six_clients_under_every_fault_kind_then_no_overlap_no_revival_and_every_live_process_is_granted(
        own_store, tmp_path):
    # 34 s of faults (each kind once, 1.5-2.5 s apart) + start-up of six Django processes
    config = harness.RunConfig(seconds=34.0, fault_gap_s=(1.5, 2.5))
    began = time.monotonic()
    result = harness.run(config, run_dir=str(tmp_path), store_pid=own_store.pid, mongo_uri=own_store.uri,
                         db_name=store.database_name())
    verdict = rules.check(result.history, config.levels, ttl_s=config.ttl_s, slack_s=SLACK_S, window_s=W_S)
    live = verdict.liveness
    print(f"\nchecker run: {time.monotonic() - began:.1f}s wall (start-up {result.startup_s:.1f}s, faulted "
          f"{result.seconds:.1f}s, shutdown {result.shutdown_s:.1f}s), {len(verdict.grants)} proven grants, "
          f"faults {result.faults}, max proven overlap {verdict.max_overlap}, revivals {len(verdict.revivals)}, "
          f"longest live wait {live.longest_live_wait_s:.2f}s, longest live gap {live.longest_live_gap_s:.2f}s, "
          f"busy to live waiters {live.busy_to_live}, grants per process {live.grants}")
    # the run is not vacuous: every fault kind happened, grants were proven, the busy rule applies
    assert set(harness.KINDS) <= set(result.faults), result.faults
    assert len(verdict.grants) >= 20, len(verdict.grants)
    assert config.wait_ms >= live.wait_bound_ms, (config.wait_ms, live.wait_bound_ms)
    assert verdict.overlaps == [], "\n".join(map(str, verdict.overlaps))
    assert verdict.revivals == [], "\n".join(map(str, verdict.revivals))
    assert live.violations == [], "\n".join(map(str, live.violations))
