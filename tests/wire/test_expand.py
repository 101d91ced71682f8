"""The compiled expansion equals numpy's boolean scatter bit for bit, however the values are chunked."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_node.wire import compile_decoder
from edge_node.wire._expand import _SHORT, place_values

_LONG = 64 * _SHORT  # sizes that take several runs and the careful loop


def reference(mask: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = np.zeros(mask.size, dtype=np.float32)
    out[mask.astype(bool)] = values
    return out


def split(values: np.ndarray, cuts: list[int]) -> list[np.ndarray]:
    return np.split(values, sorted(min(c, values.size) for c in cuts))  # empty chunks included


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(0, 3 * _LONG + 17),
    density=st.sampled_from([0.0, 0.01, 0.5, 0.99, 1.0]),
    seed=st.integers(0, 2**32 - 1),
    cuts=st.lists(st.integers(0, 3 * _LONG), max_size=5),
    read_only=st.booleans(),
)
def test_places_every_value_bit_exactly(size: int, density: float, seed: int, cuts: list[int], read_only: bool) -> None:
    rng = np.random.default_rng(seed)
    mask = (rng.random(size) < density).astype(np.uint8)
    values = rng.standard_normal(int(mask.sum())).astype(np.float32)
    values[::7] = -0.0  # a float multiply by 0 would turn inactive places of negatives into -0.0
    values.setflags(write=not read_only)
    out = np.full(size, np.nan, dtype=np.float32)  # every element must be written
    place_values(mask, split(values, cuts), out)
    assert np.array_equal(out.view(np.uint32), reference(mask, values).view(np.uint32))


def test_a_chunk_that_ends_where_a_run_ends() -> None:
    mask = np.zeros(4 * _LONG, dtype=np.uint8)
    mask[: 2 * _LONG] = 1  # its values end where the first run (as many elements as values) ends
    mask[-1] = 1
    values = np.arange(2 * _LONG + 1, dtype=np.float32)
    out = np.empty(mask.size, dtype=np.float32)
    place_values(mask, [values[: 2 * _LONG], values[2 * _LONG :]], out)
    assert np.array_equal(out, reference(mask, values))


@pytest.mark.parametrize("size", [10, 5 * _SHORT])  # the careful loop alone, and runs first
def test_more_active_elements_than_values_is_refused(size: int) -> None:
    mask = np.ones(size, dtype=np.uint8)
    chunks = [np.ones(3, dtype=np.float32), np.ones(size - 5, dtype=np.float32)]
    with pytest.raises(ValueError, match="more set elements than there are values"):
        place_values(mask, chunks, np.empty(size, np.float32))


@pytest.mark.parametrize("size", [10, 5 * _SHORT])
def test_fewer_active_elements_than_values_is_refused(size: int) -> None:
    mask = np.ones(size, dtype=np.uint8)
    mask[size // 2] = 0
    with pytest.raises(ValueError, match="fewer set elements than there are values"):
        place_values(mask, [np.ones(size, dtype=np.float32)], np.empty(size, np.float32))
    # a middle chunk whose values outlast the mask
    with pytest.raises(ValueError, match="fewer set elements"):
        place_values(mask, [np.ones(size, dtype=np.float32), np.ones(0, dtype=np.float32)], np.empty(size, np.float32))


def test_a_mask_byte_above_one_counts_by_its_low_bit_and_reads_stay_in_bounds() -> None:
    mask = np.full(8 * _SHORT, 2, dtype=np.uint8)  # no low bit set: no element active
    with pytest.raises(ValueError, match="fewer set elements"):
        place_values(mask, [np.ones(8 * _SHORT, dtype=np.float32)], np.empty(mask.size, np.float32))
    mask[::2] = 3  # low bit set on every other element
    out = np.empty(mask.size, np.float32)
    place_values(mask, [np.arange(4 * _SHORT, dtype=np.float32)], out)
    assert np.array_equal(out, reference(mask & 1, np.arange(4 * _SHORT, dtype=np.float32)))


def test_wrong_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="1-d uint8 mask"):
        place_values(np.ones(4, dtype=bool), [np.ones(4, dtype=np.float32)], np.empty(4, np.float32))
    with pytest.raises(ValueError, match="same size"):
        place_values(np.ones(4, dtype=np.uint8), [np.ones(4, dtype=np.float32)], np.empty(5, np.float32))


def test_compile_decoder_compiles_both_kinds_of_values() -> None:
    compile_decoder()
    from edge_node.wire._expand import _place_chunk

    assert len(_place_chunk.signatures) >= 2
