"""leases.ids.validation: the input checks every entry point shares (reads, actions, requests, pods, API keys)."""

from __future__ import annotations

import pytest

from leases.errors import InvalidApiKeyRequest, InvalidLeaseRequest, PodLeaseError
from leases.ids import validation


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


@pytest.mark.parametrize("value", ["high", "low", "b", "batch_2", "x-y", "a" * 32])
def test_given_a_class_name_then_priority_class_returns_it(value):
    assert validation.priority_class(value) == value


@pytest.mark.parametrize("value", ["", "High", "2nd", "_x", "-x", "a" * 33, "a.b", "a b", "hé", {"$ne": ""}, None, 1])
def test_given_no_class_name_then_priority_class_refuses_it_naming_the_field(value):
    with pytest.raises(InvalidLeaseRequest, match="^tier must be a class name"):
        validation.priority_class(value, "tier")


@pytest.mark.parametrize("value, cleaned", [
    (None, ""), ("", ""), ("http://pod-1:8000", "http://pod-1:8000"), ("https://pod.example/api//", "https://pod.example/api"),
])
def test_given_a_pod_endpoint_then_it_is_returned_without_trailing_slashes(value, cleaned):
    assert validation.pod_endpoint(value) == cleaned


@pytest.mark.parametrize("value", ["ftp://pod", "pod-1:8000", "javascript:x", "http://a\x00b",
                                   "http://" + "a" * validation.POD_ENDPOINT_MAX, 8000, {"$gt": ""}])
def test_given_a_bad_pod_endpoint_then_it_is_a_pod_lease_error(value):
    with pytest.raises(PodLeaseError) as refused:
        validation.pod_endpoint(value)
    assert refused.value.code == "POD_LEASE_INVALID"


def test_given_an_api_key_name_then_it_is_stripped_and_bad_ones_are_refused():
    assert validation.api_key_name("  ci runner ") == "ci runner"
    longest = "k" * validation.API_KEY_NAME_MAX
    assert validation.api_key_name(longest) == longest
    for bad in ("", "   ", longest + "k", "a\nb", "a\rb", "a\x00b", None, 7, {"$ne": ""}):
        with pytest.raises(InvalidApiKeyRequest):
            validation.api_key_name(bad)


@pytest.mark.parametrize("value", ["abcdefghijkl", "0123456789ab"])
def test_given_an_api_key_prefix_then_api_key_prefix_returns_it(value):
    assert validation.api_key_prefix(value) == value


@pytest.mark.parametrize("value", ["", "abcdefghijk", "abcdefghijklm", "ABCDEFGHIJKL", "abcdefghij_l",
                                   "abcdefghijk\n", {"$regex": "."}, None])
def test_given_no_api_key_prefix_then_it_is_an_invalid_api_key_request(value):
    with pytest.raises(InvalidApiKeyRequest) as refused:
        validation.api_key_prefix(value)
    assert refused.value.code == "INVALID_API_KEY_REQUEST"
