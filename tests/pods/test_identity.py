"""leases.pods.identity: a process's pod id; a forked pool child gets one of its own."""

from __future__ import annotations

import os

from leases.pods import identity


def in_forked_child(fn) -> bytes:
    """Run ``fn`` in a forked child and return what it returned (bytes)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave without running the parent's cleanup
        try:
            os.write(write_end, fn())
        finally:
            os._exit(0)
    os.close(write_end)
    try:
        return os.read(read_end, 512)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)


def test_given_no_configured_pod_id_then_it_is_host_and_pid_in_every_process(settings, monkeypatch):
    settings.POD_ID = None
    monkeypatch.delenv("POD_ID", raising=False)
    own = identity.self_pod_id()
    host = own.rsplit("-", 1)[0]
    assert own == f"{host}-{os.getpid()}" and host
    child, pid = in_forked_child(lambda: f"{identity.self_pod_id()} {os.getpid()}".encode()).decode().split()
    assert child == f"{host}-{pid}" and child != own


def test_given_a_configured_pod_id_then_a_marked_pool_child_appends_its_pid_and_the_parent_keeps_it(settings):
    settings.POD_ID = "worker-1"

    def child():
        before = identity.self_pod_id()
        identity.mark_pool_child()
        return f"{before} {identity.self_pod_id()} {os.getpid()}".encode()

    before, after, pid = in_forked_child(child).decode().split()
    assert before == "worker-1"  # forked but not (yet) marked: the solo pool's case
    assert after == f"worker-1-{pid}"
    assert identity.self_pod_id() == "worker-1"  # the mark belongs to the child alone
