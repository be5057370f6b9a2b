"""The fence string (leases.store.fence_codec): one spelling per fence, header-safe, strict."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, strategies as st

from leases.errors import InvalidFence
from leases.store import fence_codec

counters = st.text(min_size=1, max_size=200).filter(lambda s: "\x00" not in s)


@given(counter=counters, slot=st.integers(0, fence_codec.MAX_SLOT - 1),
       generation=st.integers(1, fence_codec.MAX_GENERATION))
def test_given_any_fence_then_it_round_trips_in_one_header_safe_spelling(counter, slot, generation):
    fence = fence_codec.encode(counter, slot, generation)
    assert re.fullmatch(r"[A-Za-z0-9._-]+", fence)
    assert fence_codec.decode(fence) == fence_codec.Fence(counter, slot, generation)
    assert str(fence_codec.decode(fence)) == fence


@pytest.mark.parametrize("args", [("", 0, 1), ("k", -1, 1), ("k", 0, 0), ("k", fence_codec.MAX_SLOT, 1),
                                  ("k", 0, fence_codec.MAX_GENERATION + 1)])
def test_given_values_out_of_range_then_no_fence_is_encoded(args):
    with pytest.raises(InvalidFence):
        fence_codec.encode(*args)
