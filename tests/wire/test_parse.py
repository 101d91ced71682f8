"""The tensor-message walk (``_parse``) against protobuf's own parser: same fields for every message
protobuf writes, and nothing accepted that protobuf would read otherwise or that is not canonical."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import example, given, settings
from hypothesis import strategies as st

from edge_node.wire import _parse
from edge_node.wire.messages import ProtoModelChunk, unknown_field_numbers

_UINT64 = st.one_of(st.integers(0, 300), st.integers(0, 2**64 - 1))
_TENSOR_FIELDS = st.fixed_dictionaries(
    {
        "name": st.text(max_size=40),
        "shape": st.lists(st.integers(-(2**63), 2**63 - 1) | st.integers(0, 5000), max_size=10),
        "value_type": st.integers(-(2**31), 2**31 - 1) | st.sampled_from([0, 1, 2, 3]),
        "bitmap": st.binary(max_size=300),
        "values": st.binary(max_size=300),
        "nnz": _UINT64,
        "dense": st.booleans(),
        "start": _UINT64,
        "count": _UINT64,
        "value_start": _UINT64,
    }
)
_SCALARS = {"value_type": _parse.VALUE_TYPE, "nnz": _parse.NNZ, "start": _parse.START, "count": _parse.COUNT}
_SCALARS |= {"value_start": _parse.VALUE_START}


def _walk(raw: bytes, rows: int = 16) -> tuple[int, int, int, int, bool, np.ndarray]:
    table = np.full((rows, _parse.COLUMNS), -7, dtype=np.int64)
    return (*_parse.parse(np.frombuffer(raw, dtype=np.uint8), table), table)


def _field(raw: bytes, row: np.ndarray, column: int) -> bytes:
    return raw[row[column] : row[column] + row[column + 1]]


def _assert_rows_are(raw: bytes, rows: np.ndarray, chunk: ProtoModelChunk) -> None:
    """Each row holds what protobuf reads of the same entry."""
    for row, tensor in zip(rows, chunk.tensors, strict=True):
        assert _field(raw, row, _parse.NAME_AT) == tensor.name.encode()
        assert _field(raw, row, _parse.BITMAP_AT) == tensor.bitmap
        assert _field(raw, row, _parse.VALUES_AT) == tensor.values
        assert row[_parse.DENSE] == int(tensor.dense)
        for name, column in _SCALARS.items():
            assert row[column] == getattr(tensor, name)
        assert tuple(row[_parse.SHAPE : _parse.SHAPE + row[_parse.DIMS]]) == tuple(tensor.shape)


@settings(max_examples=400, deadline=None)
@given(st.lists(_TENSOR_FIELDS, max_size=4))
def test_every_message_protobuf_writes_reads_the_same_or_is_refused_for_a_stated_reason(tensors: list[dict]) -> None:
    chunk = ProtoModelChunk(tensors=tensors)
    raw = chunk.SerializeToString()
    entries, code, detail, _where, in_entry, rows = _walk(raw)
    huge = [name for tensor in tensors for name in ("nnz", "start", "count", "value_start") if tensor[name] >= 2**63]
    if any(t["value_type"] < 0 for t in tensors):
        huge.append("value_type")  # an enum below zero travels as 2**64 less its size
    if code == _parse.TOO_LARGE:
        assert huge and in_entry
    elif code == _parse.DIMS_OVER:
        assert any(len(t["shape"]) > _parse.MAX_DIMS for t in tensors)
    else:
        assert code == _parse.OK and entries == len(tensors), (code, detail)
        assert not huge and all(len(t["shape"]) <= _parse.MAX_DIMS for t in tensors)
        _assert_rows_are(raw, rows[:entries], chunk)


def _varint(value: int, extra: int = 0) -> bytes:
    """``value`` as a varint (two's complement for a negative), ``extra`` bytes longer than its shortest."""
    value &= 2**64 - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        if not value and not extra:
            out.append(byte)
            return bytes(out)
        out.append(byte | 0x80)
        if not value:
            extra -= 1


_LENGTH_FIELDS = {1, 2, 4, 5}
_EXTRA = st.integers(0, 12).map(lambda n: 0 if n < 11 else n - 10)  # mostly the shortest form
_VALUE = st.sampled_from([0, 1, 3, 127, 128, 2**31 - 1, 2**31, 2**63 - 1, 2**63, 2**64 - 1, -1]) | st.integers(0, 10**6)


@st.composite
def _field_bytes(draw: st.DrawFn) -> tuple[bytes, bool]:
    """One field as a sender might write it: mostly right, sometimes repeated later, long, empty,
    zero, of the wrong wire type or unknown; and whether it is the shape written unpacked (protobuf reads
    that alike, and one or two dimensions written so can take exactly the canonical size)."""
    number = draw(st.integers(1, 10) | st.sampled_from([0, 11, 15, 100]))
    natural = 2 if number in _LENGTH_FIELDS else 0
    wire = draw(st.sampled_from([natural] * 6 + [0, 1, 2, 5]))
    tag = _varint(number << 3 | wire, draw(_EXTRA))
    if wire == 1:
        return tag + draw(st.binary(min_size=8, max_size=8)), False
    if wire == 5:
        return tag + draw(st.binary(min_size=4, max_size=4)), False
    if wire == 0:
        # the bools (7 dense, 11 buffer) as 0/1: one of another value has the canonical size (see the cases)
        value = draw(st.integers(0, 1)) if number in (7, 11) else draw(_VALUE)
        return tag + _varint(value, draw(_EXTRA)), number == 2
    if number == 1:
        payload = draw(st.text(max_size=12)).encode()
    elif number == 2:
        payload = b"".join(_varint(v, draw(_EXTRA)) for v in draw(st.lists(_VALUE, max_size=10)))
    else:
        payload = draw(st.binary(max_size=24))
    return tag + _varint(len(payload), draw(_EXTRA)) + payload, False


@st.composite
def _message(draw: st.DrawFn) -> tuple[bytes, bool]:
    """A ModelChunk of up to three tensor entries, and whether any of them holds its shape unpacked."""
    entries = draw(st.lists(st.lists(_field_bytes(), max_size=12), max_size=3))
    bodies = [b"".join(raw for raw, _unpacked in fields) for fields in entries]
    parts = [b"\x12" + _varint(len(body), draw(_EXTRA)) + body for body in bodies]
    if draw(st.integers(0, 9)) == 0:  # now and then a field of the message itself: a header, or unknown
        parts.insert(
            draw(st.integers(0, len(parts))), draw(st.sampled_from([b"\x0a\x00", b"\x0a\x02\x08\x01", b"\x78\x01"]))
        )
    return b"".join(parts), any(unpacked for fields in entries for _raw, unpacked in fields)


def _protobuf_reads(raw: bytes) -> ProtoModelChunk | None:
    try:
        return ProtoModelChunk.FromString(raw)
    except DecodeError:
        return None


def _canonical_and_in_range(raw: bytes, chunk: ProtoModelChunk | None, unpacked_shape: bool) -> bool:
    """What the walk must accept: protobuf reads it, with no header and no unknown field, in exactly its
    fields' canonical size and no shape unpacked (a size can match without it: one dimension in a long varint,
    or two dimensions, take the packed form's bytes), every count below 2**63, a value type within an int32
    and at most 8 dimensions."""
    if chunk is None or chunk.HasField("header") or unknown_field_numbers(chunk) or chunk.ByteSize() != len(raw):
        return False
    if unpacked_shape:
        return False
    return all(
        not unknown_field_numbers(t)
        and max(t.nnz, t.start, t.count, t.value_start) < 2**63
        and 0 <= t.value_type < 2**31
        and len(t.shape) <= _parse.MAX_DIMS
        for t in chunk.tensors
    )


@settings(max_examples=1500, deadline=None)
@given(_message())
@example((b"\x12\x03\x10\x80\x00", True))  # shape [0] unpacked in a long varint: the canonical size
@example((b"\x12\x04\x10\x01\x10\x02", True))  # shape [1, 2] unpacked: the canonical size too
@example((b"\x12\x04\x12\x02\x01\x02", False))  # and packed
@example((b"\x12\x02\x58\x01", False))  # buffer = true: canonical (a buffer of 3 is refused: the cases)
def test_the_walk_accepts_exactly_the_canonical_messages_protobuf_reads_and_reads_them_alike(
    message: tuple[bytes, bool],
) -> None:
    raw, unpacked_shape = message
    entries, code, detail, where, _in_entry, rows = _walk(raw)
    chunk = _protobuf_reads(raw)
    assert (code == _parse.OK) == _canonical_and_in_range(raw, chunk, unpacked_shape), (code, detail, where)
    if code == _parse.OK:
        assert chunk is not None and entries == len(chunk.tensors)
        _assert_rows_are(raw, rows[:entries], chunk)


def _tensor(body: bytes) -> bytes:
    return b"\x12" + bytes([len(body)]) + body


@pytest.mark.parametrize(
    ("raw", "code", "detail"),
    [
        (b"\x12\x05\x0a\x01a", _parse.TRUNCATED, 2),  # the entry's length runs past the message
        (_tensor(b"\x0a\x05ab"), _parse.TRUNCATED, 1),  # the name's length runs past the entry
        (_tensor(b"\x30\x80"), _parse.TRUNCATED, 6),  # a varint cut off
        (_tensor(b"\x30\x81\x00"), _parse.LONG_VARINT, 6),  # 1 in two bytes
        (_tensor(b"\x30" + b"\xff" * 9 + b"\x02"), _parse.OVERFLOW, 6),  # 65 bits
        (_tensor(b"\x30" + b"\xff" * 10 + b"\x01"), _parse.OVERFLOW, 6),  # eleven bytes
        (_tensor(b"\x30" + b"\xff" * 9 + b"\x01"), _parse.TOO_LARGE, 6),  # 2**64 - 1
        (_tensor(b"\x18\x80\x80\x80\x80\x08"), _parse.TOO_LARGE, 3),  # a value type beyond an int32
        (_tensor(b"\x30\x01\x30\x02"), _parse.REPEATED, 6),
        (_tensor(b"\x30\x00"), _parse.DEFAULT, 6),  # a zero a canonical sender omits
        (_tensor(b"\x22\x00"), _parse.DEFAULT, 4),  # an empty bitmap likewise
        (_tensor(b"\x38\x02"), _parse.LONG_VARINT, 7),  # dense is 1 or absent
        (_tensor(b"\x31" + b"\x00" * 8), _parse.WIRE_TYPE, 6),  # nnz as a fixed64
        (_tensor(b"\x10\x03"), _parse.WIRE_TYPE, 2),  # shape unpacked
        (_tensor(b"\x12\x09" + b"\x01" * 9), _parse.DIMS_OVER, 2),
        (_tensor(b"\x60\x01"), _parse.UNKNOWN, 12),  # 1.3 defines 11 (buffer)
        (_tensor(b"\x58\x02"), _parse.LONG_VARINT, 11),  # buffer is 1 or absent
        (_tensor(b"\x03"), _parse.UNKNOWN, 0),  # field 0 (a start-group tag)
        (b"\x0a\x00", _parse.HEADER, 1),
        (b"\x78\x01", _parse.UNKNOWN, 15),
        (b"\x10\x01", _parse.WIRE_TYPE, 2),  # tensors as a varint
        (b"\x92\x00\x00", _parse.LONG_VARINT, 0),  # the tensors tag in two bytes
    ],
)
def test_each_way_a_message_breaks_has_its_code(raw: bytes, code: int, detail: int) -> None:
    got = _walk(raw)
    assert got[1:3] == (code, detail)


def test_more_entries_than_rows_stop_the_walk_without_writing_past_them() -> None:
    one = _tensor(b"\x30\x01")
    entries, code, _detail, _where, _in_entry, rows = _walk(one * 5, rows=3)
    assert (entries, code) == (3, _parse.ENTRIES_OVER)
    assert (rows[:, _parse.NNZ] == 1).all()
