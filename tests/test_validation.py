"""leases.validation: the operator-input checks the reads and actions share."""

from __future__ import annotations

import pytest

from leases import validation
from leases.errors import InvalidLeaseRequest


@pytest.mark.parametrize("value", [None, ""])
def test_given_a_missing_filter_then_optional_is_none_and_the_check_is_not_run(value):
    def refuse(*_):
        raise AssertionError("check ran")

    assert validation.optional(value, refuse) is None


def test_given_a_present_filter_then_optional_runs_the_check_with_its_arguments():
    assert validation.optional("acme", validation.entity_id, "tenant id") == "acme"
    with pytest.raises(InvalidLeaseRequest):
        validation.optional({"$ne": ""}, validation.entity_id, "tenant id")


@pytest.mark.parametrize("value, number", [(1, 1), ("7", 7), (500, 500)])
def test_given_an_integer_in_range_then_positive_int_returns_it(value, number):
    assert validation.positive_int(value, "page", 500) == number


@pytest.mark.parametrize("value", [0, -1, 501, True, "x", None, 1.5j, {"$gt": 0}])
def test_given_no_integer_in_range_then_positive_int_refuses_it(value):
    with pytest.raises(InvalidLeaseRequest):
        validation.positive_int(value, "page", 500)


def test_given_a_reason_then_it_is_stripped_and_bad_ones_are_refused():
    assert validation.reason("  stuck job ") == "stuck job"
    assert validation.reason("x" * validation.REASON_MAX) == "x" * validation.REASON_MAX
    for bad in ("", "   ", "x" * (validation.REASON_MAX + 1), "a\x00b", None, 3):
        with pytest.raises(InvalidLeaseRequest):
            validation.reason(bad)
