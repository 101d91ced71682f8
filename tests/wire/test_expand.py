"""The compiled expansion equals numpy's boolean scatter bit for bit, however the stream cuts its chunks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_node.wire import ValueType
from edge_node.wire._expand import _SHORT, _UNPACKED, Expansion, _unpack, fill_dense

_LONG = 64 * _SHORT  # sizes that take several runs and the careful loop


def reference(mask: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = np.zeros(mask.size, dtype=np.float32)
    out[mask.astype(bool)] = values
    return out


def expand(
    mask: np.ndarray,
    values: np.ndarray,
    element_cuts: list[int],
    value_cuts: list[int],
    kind: ValueType = ValueType.FLOAT32,
) -> Expansion:
    """Feed ``mask`` and ``values`` as a stream would: bitmap ranges cut at multiples of 8, values anywhere."""
    ends = sorted({min(c // 8 * 8, mask.size) for c in element_cuts} | {mask.size})
    starts = [0, *ends[:-1]]
    value_parts = np.split(values, sorted(min(c, values.size) for c in value_cuts[: len(ends) - 1]))
    value_parts += [values[:0]] * (len(ends) - len(value_parts))  # fewer value cuts: empty chunks at the end
    expansion = Expansion(mask.size, kind)
    for start, end, part in zip(starts, ends, value_parts, strict=True):
        bitmap = np.packbits(mask[start:end], bitorder="little")
        bitmap.setflags(write=False)  # as a view of the message
        assert expansion.add(bitmap, end - start, part) == 0
    return expansion


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(0, 3 * _LONG + 17),
    density=st.sampled_from([0.0, 0.01, 0.5, 0.99, 1.0]),
    seed=st.integers(0, 2**32 - 1),
    element_cuts=st.lists(st.integers(0, 3 * _LONG + 17), max_size=5),
    value_cuts=st.lists(st.integers(0, 3 * _LONG), max_size=5),
    read_only=st.booleans(),
    kind=st.sampled_from([ValueType.FLOAT32, ValueType.FLOAT16, ValueType.BFLOAT16]),
)
def test_places_every_value_bit_exactly_however_the_chunks_cut(
    size: int,
    density: float,
    seed: int,
    element_cuts: list[int],
    value_cuts: list[int],
    read_only: bool,
    kind: ValueType,
) -> None:
    """float32 values placed as they are; fp16 and bf16 ones widened as numpy and torch widen them."""
    rng = np.random.default_rng(seed)
    mask = (rng.random(size) < density).astype(np.uint8)
    wide = (rng.standard_normal(int(mask.sum())) * 10.0 ** int(rng.integers(-9, 4))).astype(np.float32)
    wide[::7] = -0.0  # a float multiply by 0 would turn inactive places of negatives into -0.0
    if kind is ValueType.FLOAT16:
        values = wide.astype(np.float16).view(np.uint16)  # subnormals and zeros among the small ones
        expected = values.view(np.float16).astype(np.float32)
    elif kind is ValueType.BFLOAT16:
        values = torch.from_numpy(wide).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
        expected = torch.from_numpy(values.view(np.int16)).view(torch.bfloat16).float().numpy()
    else:
        values = expected = wide
    values.setflags(write=not read_only)
    expansion = expand(mask, values, element_cuts, value_cuts, kind)
    expansion.finish()
    assert np.array_equal(expansion.weight.view(np.uint32), reference(mask, expected).view(np.uint32))
    assert np.array_equal(expansion.mask, mask) and expansion.values == values.size


def test_values_ahead_of_the_bitmap_wait_for_it() -> None:
    """A first chunk's values may belong to the next chunk's range: they are placed once it arrives."""
    mask = np.zeros(4 * _LONG, dtype=np.uint8)
    mask[2 * _LONG :] = 1  # every active element in the second half
    values = np.arange(2 * _LONG, dtype=np.float32)
    expansion = Expansion(mask.size)
    expansion.add(np.packbits(mask[: 2 * _LONG], bitorder="little"), 2 * _LONG, values)  # none placeable yet
    expansion.add(np.packbits(mask[2 * _LONG :], bitorder="little"), 2 * _LONG, values[:0])
    expansion.finish()
    assert np.array_equal(expansion.weight, reference(mask, values))


def test_a_chunk_that_ends_where_a_run_ends() -> None:
    mask = np.zeros(4 * _LONG, dtype=np.uint8)
    mask[: 2 * _LONG] = 1  # its values end where the first run (as many elements as values) ends
    mask[-1] = 1
    values = np.arange(2 * _LONG + 1, dtype=np.float32)
    expansion = expand(mask, values, [2 * _LONG], [2 * _LONG])
    expansion.finish()
    assert np.array_equal(expansion.weight, reference(mask, values))


@pytest.mark.parametrize("size", [16, 5 * _LONG])  # the careful loop alone, and runs first
def test_more_active_elements_than_values_is_refused(size: int) -> None:
    mask = np.ones(size, dtype=np.uint8)
    expansion = expand(mask, np.ones(size - 2, dtype=np.float32), [size // 2], [3])
    with pytest.raises(ValueError, match="more set elements than there are values"):
        expansion.finish()


@pytest.mark.parametrize("size", [16, 5 * _LONG])
def test_fewer_active_elements_than_values_is_refused(size: int) -> None:
    mask = np.ones(size, dtype=np.uint8)
    mask[size // 2] = 0
    expansion = expand(mask, np.ones(size, dtype=np.float32), [size // 2], [size])  # all values in the first chunk
    with pytest.raises(ValueError, match="fewer set elements than there are values"):
        expansion.finish()


def test_finish_before_the_whole_bitmap_and_wrong_arguments_are_refused() -> None:
    expansion = Expansion(16)
    expansion.add(np.array([255], dtype=np.uint8), 8, np.ones(8, dtype=np.float32))
    with pytest.raises(ValueError, match="the bitmap of 8 of 16 elements arrived"):
        expansion.finish()
    with pytest.raises(ValueError, match="at least count bits"):
        expansion.add(np.array([255], dtype=np.uint8), 9, np.ones(8, dtype=np.float32))  # a bitmap too short
    with pytest.raises(ValueError, match="within the tensor"):
        expansion.add(np.array([255, 255], dtype=np.uint8), 16, np.ones(8, dtype=np.float32))  # past numel
    with pytest.raises(ValueError, match="float32 or uint32 values"):
        expansion.add(np.array([255], dtype=np.uint8), 8, np.ones(8, dtype=np.float64))
    with pytest.raises(ValueError, match="float32 or uint32 values"):  # 16-bit values on a float32 tensor
        expansion.add(np.array([255], dtype=np.uint8), 8, np.ones(8, dtype=np.uint16))
    with pytest.raises(ValueError, match="uint16 values"):
        Expansion(16, ValueType.FLOAT16).add(np.array([255], dtype=np.uint8), 8, np.ones(8, dtype=np.float32))
    with pytest.raises(ValueError, match="uint16 values and as many float32 places"):
        fill_dense(np.ones(8, dtype="<u2"), np.empty(7, dtype=np.float32), ValueType.FLOAT16)


_NON_FINITE = {
    ValueType.FLOAT32: np.array([np.inf, -np.inf, np.nan], dtype=np.float32).view(np.uint32),
    ValueType.FLOAT16: np.array([np.inf, -np.inf, np.nan], dtype=np.float16).view(np.uint16),
    ValueType.BFLOAT16: torch.tensor([float("inf"), float("-inf"), float("nan")]).to(torch.bfloat16).view(torch.int16)
    .numpy().view(np.uint16),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(ValueType), ids=lambda kind: kind.name)
@pytest.mark.parametrize("queued", [0, 1, 2])  # values waiting from earlier chunks: none, one chunk's, two
def test_a_chunk_with_inf_or_nan_is_counted_and_changes_nothing(kind: ValueType, queued: int) -> None:
    """Every Inf and NaN of a chunk is counted on its bits, however many values wait from earlier chunks;
    the refused chunk leaves the expansion as it was (and the next good chunk is placed as if it never came)."""
    size = 4 * _LONG
    mask = np.zeros(size, dtype=np.uint8)
    mask[queued * 8 :] = 1  # the first ``queued`` chunks' elements are inactive: their values wait
    good = np.zeros(size, dtype=np.uint32 if kind is ValueType.FLOAT32 else np.uint16)
    bad = good[:_LONG].copy()
    bad[[3, 70, _LONG - 1]] = _NON_FINITE[kind]
    expansion = Expansion(size, kind)
    for i in range(queued):
        assert expansion.add(np.packbits(mask[i * 8 : i * 8 + 8], bitorder="little"), 8, good[i : i + 1]) == 0
    before = (expansion.received, expansion.values, expansion.mask.copy(), expansion.weight.copy())
    start = queued * 8
    assert expansion.add(np.packbits(mask[start:], bitorder="little"), size - start, bad) == 3
    after = (expansion.received, expansion.values, expansion.mask, expansion.weight)
    assert before[:2] == after[:2]
    assert expansion.add(np.packbits(mask[start:], bitorder="little"), size - start, good[queued : size - start]) == 0
    expansion.finish()
    assert not expansion.weight.any() and np.array_equal(expansion.mask, mask)
    out = np.full(_LONG, 7.0, dtype=np.float32)
    assert fill_dense(bad, out, kind) == 3 and (out == 7.0).all()


@settings(max_examples=50, deadline=None)
@given(size=st.integers(0, 200), seed=st.integers(0, 2**32 - 1))
def test_unpacking_equals_numpys(size: int, seed: int) -> None:
    bits = np.random.default_rng(seed).integers(0, 256, (size + 7) // 8, dtype=np.uint8)
    out = np.full(size, 7, dtype=np.uint8)
    _unpack(bits, out, _UNPACKED)
    assert np.array_equal(out, np.unpackbits(bits, count=size, bitorder="little"))


_DECODE_AFTER_COMPILE = """
import json

from edge_node.wire import ValueType, _parse, compile_decoder, decode_model, encode_model
from edge_node.wire import _expand
from tests.wire_models import PEER_FLEET, PEER_SHAPES, PEER_SPEC, kept_fraction, random_model

compile_decoder()
names = ("_add_chunk", "_count_non_finite", "_fill", "_place_chunk", "_place_run", "_place_run_widened", "_unpack")
loops = (*(getattr(_expand, name) for name in names), _parse._compiled())
compiled = [len(loop.signatures) for loop in loops]
weights, masks = random_model(PEER_SHAPES, 3, 0.5)
for value_type in ValueType:
    messages = encode_model(
        PEER_SPEC, weights, masks, node_id="node-a", fleet_id=PEER_FLEET, round=1, density=kept_fraction(masks),
        value_type=value_type, max_message_bytes=4096,
    )
    decode_model([m.SerializeToString() for m in messages], PEER_SPEC, PEER_FLEET)
print(json.dumps([compiled, [len(loop.signatures) for loop in loops]]))
"""


def test_compile_decoder_compiles_what_a_decode_uses() -> None:
    """After ``compile_decoder``, decoding fp32, fp16 and bf16 streams compiles nothing more (the expansion's
    loops, nor the message walk): a daemon compiles
    at start, not in its first pull. In a fresh process (other tests here compile other kinds of arrays)."""
    done = subprocess.run(
        [sys.executable, "-c", _DECODE_AFTER_COMPILE],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr
    compiled, after = json.loads(done.stdout)
    assert compiled == after and all(compiled), (compiled, after)
