"""A tensor message's fields read where they lie: one compiled pass, no copy of a bitmap or values.

protobuf's parser copies every ``bytes`` field into the message it builds, and reading the field
copies it again: two copies of a pull's whole payload (about 1.3 ms of a ResNet18 pull), then the
decoder counted the fields' canonical size in Python to refuse padding. This walk reads a
``ModelChunk`` that carries tensors (``tensors = 2`` entries of ``SparseTensor``, never a header)
and accepts exactly its canonical encoding, which is the only one an honest sender produces:

- every field is known and of its declared wire type, and appears at most once per entry;
- no field holds its default (proto3 omits zeros and empty strings: a present zero is padding);
- every varint and length is in its shortest form and within 64 bits, every length within its
  message; ``shape`` is packed; ``dense`` and ``buffer`` (1.3), when present, are 1.

Any order of the fields is accepted (protobuf's own parsers accept any). What it returns are
offsets into the message and the scalar fields, one row per entry (the columns below); the
decoder then checks them against the stream and hands views of the message to the builds. Those
views start wherever a field lies, not on a 4-byte boundary: x86-64 and aarch64 load unaligned
words at full speed. The codes below say what broke; ``parse_error`` words them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

# The columns of a parsed entry.
NAME_AT, NAME_LEN, VALUE_TYPE, BITMAP_AT, BITMAP_LEN, VALUES_AT, VALUES_LEN = range(7)
NNZ, DENSE, START, COUNT, VALUE_START, DIMS, SHAPE = range(7, 14)
MAX_DIMS = 8  # shape entries kept; a spec's tensors have at most 4
BUFFER = SHAPE + MAX_DIMS  # field 11 (1.3): the chunk is a running statistic's
COLUMNS = BUFFER + 1
_FIELDS = 11  # the highest field number of a SparseTensor

# Each field's column (index: the field number, 1-11), and which fields are length-delimited.
_FIELD_COLUMN = np.array(
    [-1, NAME_AT, DIMS, VALUE_TYPE, BITMAP_AT, VALUES_AT, NNZ, DENSE, START, COUNT, VALUE_START, BUFFER]
)
_LENGTH_DELIMITED = np.array([False, True, True, False, True, True, False, False, False, False, False, False])

# What broke (``parse`` returns the code, a detail and the byte where it broke).
(
    OK,
    TRUNCATED,
    LONG_VARINT,
    OVERFLOW,
    HEADER,
    UNKNOWN,
    REPEATED,
    WIRE_TYPE,
    DEFAULT,
    TOO_LARGE,
    DIMS_OVER,
    ENTRIES_OVER,
) = range(12)
_NON_CANONICAL = {LONG_VARINT, REPEATED, WIRE_TYPE, DEFAULT}
_WORDS = {
    TRUNCATED: "a field runs past the end of its message",
    LONG_VARINT: "a varint is longer than its shortest form",
    OVERFLOW: "a varint is longer than 64 bits",
    REPEATED: "field {detail} appears twice in one tensor chunk",
    WIRE_TYPE: "field {detail} of a tensor chunk has the wrong wire type",
    DEFAULT: "field {detail} of a tensor chunk holds its default value (a canonical sender omits it)",
    TOO_LARGE: "field {detail} of a tensor chunk is out of its type's range",
    DIMS_OVER: f"a tensor chunk's shape has more than {MAX_DIMS} dimensions",
}
_LIMIT = np.uint64(1) << np.uint64(63)  # a uint64 field's (beyond: no count this decoder could use)
_ENUM_LIMIT = np.uint64(1) << np.uint64(31)  # ``value_type``'s: an enum is an int32 (a negative takes ten bytes)


@functools.cache
def _compiled() -> Callable[[np.ndarray, np.ndarray], tuple[int, int, int, int, bool]]:
    """The compiled walk; numba loads with the first tensor message, not with this package (a simulation
    never decodes)."""
    import numba

    @numba.njit(nogil=True, boundscheck=False)
    def _varint(buf: np.ndarray, pos: int, end: int) -> tuple[np.uint64, int, int]:
        """The varint at ``pos``: (value, next position, error code)."""
        value = np.uint64(0)
        shift = 0
        while pos < end:
            byte = buf[pos]
            pos += 1
            value |= np.uint64(byte & 0x7F) << np.uint64(shift)
            if byte < 0x80:
                if shift == 63 and byte > 1:
                    return value, pos, OVERFLOW
                if byte == 0 and shift > 0:
                    return value, pos, LONG_VARINT
                return value, pos, OK
            shift += 7
            if shift > 63:
                return value, pos, OVERFLOW
        return value, pos, TRUNCATED

    @numba.njit(nogil=True, boundscheck=False)
    def _entry(buf: np.ndarray, pos: int, end: int, row: np.ndarray) -> tuple[int, int, int]:
        """Fill ``row`` from the SparseTensor encoded in ``buf[pos:end]``: (code, detail, byte)."""
        for c in range(COLUMNS):
            row[c] = 0
        seen = 0
        while pos < end:
            at = pos
            tag, pos, code = _varint(buf, pos, end)
            if code != OK:
                return code, 0, at
            if tag >= _LIMIT:
                return UNKNOWN, -1, at
            field = np.int64(tag) >> 3
            wire = np.int64(tag) & 7
            if field < 1 or field > _FIELDS:
                return UNKNOWN, field, at
            if seen & (1 << field):
                return REPEATED, field, at
            seen |= 1 << field
            if _LENGTH_DELIMITED[field] != (wire == 2) or (wire != 0 and wire != 2):
                return WIRE_TYPE, field, at
            value, pos, code = _varint(buf, pos, end)
            if code != OK:
                return code, field, at
            if value == 0:
                return DEFAULT, field, at
            if wire == 0:
                if value >= _LIMIT or (field == 3 and value >= _ENUM_LIMIT):
                    return TOO_LARGE, field, at
                if (field == 7 or field == 11) and value != 1:
                    return LONG_VARINT, field, at  # a bool is 1; a larger varint is another encoding of it
                row[_FIELD_COLUMN[field]] = np.int64(value)
                continue
            if value > np.uint64(end - pos):
                return TRUNCATED, field, at
            length = int(value)
            if field == 2:  # the packed shape: int64 varints (a negative one takes ten bytes)
                stop = pos + length
                dims = 0
                while pos < stop:
                    dim, pos, code = _varint(buf, pos, stop)
                    if code != OK:
                        return code, field, at
                    if dims == MAX_DIMS:
                        return DIMS_OVER, field, at
                    row[SHAPE + dims] = np.int64(dim)
                    dims += 1
                row[DIMS] = dims
                continue
            column = _FIELD_COLUMN[field]
            row[column] = pos
            row[column + 1] = length
            pos += length
        return OK, 0, pos

    @numba.njit(nogil=True, boundscheck=False)
    def walk(buf: np.ndarray, rows: np.ndarray) -> tuple[int, int, int, int, bool]:
        """``parse``, compiled."""
        size = buf.size
        pos = 0
        n = 0
        while pos < size:
            at = pos
            tag, pos, code = _varint(buf, pos, size)
            if code != OK:
                return n, code, 0, at, False
            if tag == 0x0A:  # field 1, a header
                return n, HEADER, 1, at, False
            if tag != 0x12:  # anything but field 2, length-delimited
                field = np.int64(tag) >> 3 if tag < _LIMIT else -1
                return n, (WIRE_TYPE if field == 2 else UNKNOWN), field, at, False
            length, pos, code = _varint(buf, pos, size)
            if code != OK:
                return n, code, 2, at, False
            if length > np.uint64(size - pos):
                return n, TRUNCATED, 2, at, False
            if n == rows.shape[0]:
                return n, ENTRIES_OVER, 0, at, False
            end = pos + np.int64(length)
            code, detail, where = _entry(buf, pos, end, rows[n])
            if code != OK:
                return n, code, detail, where, True
            pos = end
            n += 1
        return n, OK, 0, pos, False

    return walk


def parse(buf: np.ndarray, rows: np.ndarray) -> tuple[int, int, int, int, bool]:
    """Parse a tensor message (``buf``: its bytes as uint8) into ``rows`` (one an entry, ``COLUMNS``
    wide): (entries, code, detail, byte, whether it broke inside an entry).

    An entry beyond ``rows`` stops the walk (``ENTRIES_OVER``). When an entry breaks, its row (index
    ``entries``) holds what was read of it before.
    """
    return _compiled()(buf, rows)


def parse_error(code: int, detail: int, where: int) -> tuple[str, bool]:
    """The words for a ``parse`` code other than OK, HEADER, UNKNOWN and ENTRIES_OVER (which the
    decoder words itself), and whether the encoding is a non-canonical form of a valid message."""
    return f"{_WORDS[code].format(detail=detail)} (at byte {where})", code in _NON_CANONICAL


def compile_parser() -> None:
    """Compile ``parse`` for what the decoder hands it: a read-only byte view of a message."""
    buf = np.frombuffer(b"\x12\x02\x30\x01", dtype=np.uint8)
    parse(buf, np.zeros((1, COLUMNS), dtype=np.int64))
