"""leases.revocation.handlers: one handler per lease type; a second one only when asked to replace."""

from __future__ import annotations

import pytest

from leases.errors import HandlerAlreadyRegistered, InvalidLeaseRequest, LeaseError, UnknownLeaseType
from leases.revocation import handlers


class First(handlers.LeaseHandler):
    type = "regtest"

    def on_revoked(self, holder):
        pass


class Second(First):
    pass


@pytest.fixture(autouse=True)
def clean():
    handlers.unregister_handler("regtest")
    yield
    handlers.unregister_handler("regtest")


def test_given_a_type_with_a_handler_when_another_registers_then_it_is_refused_and_the_first_stays():
    first = handlers.register_handler(First())
    with pytest.raises(HandlerAlreadyRegistered) as refused:
        handlers.register_handler(Second())
    assert isinstance(refused.value, LeaseError) and refused.value.code == "HANDLER_ALREADY_REGISTERED"
    assert "First" in str(refused.value)
    assert handlers.get_handler("regtest") is first


def test_given_replace_when_another_registers_then_it_replaces_the_first():
    handlers.register_handler(First())
    second = handlers.register_handler(Second(), replace=True)
    assert handlers.get_handler("regtest") is second


def test_given_the_same_handler_when_registered_again_then_nothing_changes():
    first = handlers.register_handler(First())
    assert handlers.register_handler(first) is first
    assert handlers.get_handler("regtest") is first


def test_given_an_unregistered_type_then_a_new_handler_may_take_it():
    handlers.register_handler(First())
    handlers.unregister_handler("regtest")
    second = handlers.register_handler(Second())
    assert handlers.get_handler("regtest") is second and "regtest" in handlers.registered_types()
    handlers.unregister_handler("regtest")
    with pytest.raises(UnknownLeaseType):
        handlers.get_handler("regtest")


@pytest.mark.parametrize("bad_type", ["", "Bad Type", None, "x" * 200])
def test_given_a_handler_without_a_valid_type_then_it_is_refused(bad_type):
    class Nameless(First):
        type = bad_type

    with pytest.raises(InvalidLeaseRequest):
        handlers.register_handler(Nameless())
    assert bad_type not in handlers.registered_types()
