"""A sparse tensor's values put in their places in one pass: the decoder's expansion, compiled by numba.

numpy takes three passes and an index array twice the size of the values (``flatnonzero``, zeros,
then an integer scatter): most of a pull's decoding CPU. This loop reads the unpacked mask and the
values once and writes every element once, with no branch on the mask bits (a random mask defeats
branch prediction): an inactive element gets value bits times 0.

Values are handled as their float32 bit patterns (``uint32``), so the result is bit-exact: an
inactive element is +0.0 and an active -0.0 stays -0.0 (a float multiply would give -0.0 for the
inactive places of negative values). 16-bit values (fp16, bf16) are widened in the same pass, each
looked up in a table of the 65,536 float32 bit patterns: a chunk of a million elements at density
0.5 took 0.73 ms widened first by numpy, 0.46 ms so (the decoder's Inf and NaN check included).
"""

from __future__ import annotations

import collections

import numba
import numpy as np

# Fewer elements than this left for a chunk's values: the careful loop takes them.
_SHORT = 64


@numba.njit(nogil=True, boundscheck=False)
def _place_run(mask: np.ndarray, values: np.ndarray, out: np.ndarray, count: int) -> int:
    """The branch-free loop over ``count`` elements; returns the values used. Needs ``count`` values left.

    Its own function, starting at element 0 of views: LLVM compiles this shape about twice as fast
    as the same loop from a start offset (0.33 against 0.73 ns an element, measured).
    """
    k = 0
    for i in range(count):
        bit = np.uint32(mask[i]) & np.uint32(1)  # the low bit: a byte above 1 cannot move k by more than 1
        out[i] = values[k] * bit
        k += bit
    return k


@numba.njit(nogil=True, boundscheck=False)
def _place_run_widened(mask: np.ndarray, values: np.ndarray, out: np.ndarray, count: int, table: np.ndarray) -> int:
    """``_place_run`` for 16-bit values: each one's float32 bits are ``table[value]``."""
    k = 0
    for i in range(count):
        bit = np.uint32(mask[i]) & np.uint32(1)
        out[i] = table[values[k]] * bit
        k += bit
    return k


@numba.njit(nogil=True, boundscheck=False)
def _place_chunk(
    mask: np.ndarray, start: int, values: np.ndarray, out: np.ndarray, table: np.ndarray
) -> tuple[int, int]:
    """Write ``values`` to ``out`` (uint32) at ``mask``'s set elements from ``start`` on, 0 elsewhere.

    ``values`` are float32 bits (uint32; ``table`` empty) or 16-bit values whose float32 bits are
    ``table[value]``. Returns where the next chunk's values begin (the first set element this chunk
    had no value for, or ``out.size``) and how many of ``values`` it placed. Reads stay in bounds
    whatever the mask: a run of m elements uses at most m values, so runs are as long as the values
    left (halving each time at density 0.5), and the last few elements take the careful loop.
    """
    n = values.size
    size = out.size
    widen = table.size > 0
    k = 0
    i = start
    while True:
        count = min(size - i, n - k)
        if count < _SHORT:
            break
        if widen:
            k += _place_run_widened(mask[i:], values[k:], out[i:], count, table)
        else:
            k += _place_run(mask[i:], values[k:], out[i:], count)
        i += count
    for j in range(i, size):
        if mask[j] & 1:
            if k == n:
                return j, k
            out[j] = table[values[k]] if widen else values[k]
            k += 1
        else:
            out[j] = 0
    return size, k


# Byte b of a bitmap unpacked: eight mask bytes, 0 or 1, read as one native uint64.
_UNPACKED = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little").view(np.uint64).ravel()


@numba.njit(nogil=True, boundscheck=False)
def _unpack(bits: np.ndarray, out: np.ndarray, table: np.ndarray) -> None:
    """``out[i]`` = bit ``i`` of ``bits`` (little-endian within a byte), for every element of ``out``.

    Eight elements a table lookup (numpy's ``unpackbits`` trick; bit by bit took 5x longer).
    """
    whole = out.size >> 3
    words = out[: whole << 3].view(np.uint64)
    for j in range(whole):
        words[j] = table[bits[j]]
    for i in range(whole << 3, out.size):
        out[i] = (bits[i >> 3] >> (i & 7)) & 1


_NO_TABLE = np.empty(0, dtype=np.uint32)


class Expansion:
    """One tensor's float32 weights and uint8 mask, built chunk by chunk as a stream delivers them.

    A chunk brings the next range of the bitmap and the next values; values go to the set elements
    in order, wherever the chunks' ranges cut (a chunk's values may belong to the next one's range).
    Each ``add`` places what the bitmap received so far allows, so a large tensor is mostly built
    while the rest of its stream arrives. One thread at a time (the decoder runs a tensor's chunks
    in order).

    Values are float32, or (``table`` given: 65,536 float32 bit patterns as uint32) 16-bit values
    widened to ``table[value]`` as they are placed.
    """

    def __init__(self, numel: int, table: np.ndarray | None = None) -> None:
        if table is not None and (table.dtype != np.uint32 or table.shape != (1 << 16,)):
            raise ValueError("table must hold 65,536 uint32 float32 bit patterns")
        self.weight = np.empty(numel, dtype=np.float32)
        self.mask = np.empty(numel, dtype=np.uint8)
        self.values = 0  # values received
        self.received = 0  # elements whose bitmap has arrived
        self._position = 0  # elements written
        self._table = _NO_TABLE if table is None else table
        self._value_type = np.dtype(np.float32 if table is None else np.uint16)
        self._no_values = np.empty(0, dtype=np.uint32 if table is None else np.uint16)
        self._pending: collections.deque[np.ndarray] = collections.deque()  # not yet placed (float32 as uint32 bits)

    def add(self, bitmap: np.ndarray, count: int, values: np.ndarray) -> None:
        """The next ``count`` elements' bitmap (uint8, little-endian bits) and the next values (float32,
        or uint16 with a ``table``)."""
        end = self.received + count
        if (
            bitmap.dtype != np.uint8
            or values.dtype != self._value_type
            or end > self.mask.size
            or bitmap.size * 8 < count
        ):
            raise ValueError(
                f"add needs a uint8 bitmap of at least count bits, within the tensor, and {self._value_type} values"
            )
        _unpack(bitmap, self.mask[self.received : end], _UNPACKED)
        self.received = end
        self.values += values.size
        if values.size:
            values = np.ascontiguousarray(values)
            self._pending.append(values.view(np.uint32) if values.dtype == np.float32 else values)
        mask, target = self.mask[:end], self.weight.view(np.uint32)[:end]
        if not self._pending:  # no value to place: the inactive elements up to the next active one are zeros
            self._position, _ = _place_chunk(mask, self._position, self._no_values, target, self._table)
        while self._pending:
            chunk = self._pending[0]
            self._position, placed = _place_chunk(mask, self._position, chunk, target, self._table)
            if placed < chunk.size:  # the bitmap received so far has no more set elements
                self._pending[0] = chunk[placed:]
                break
            self._pending.popleft()

    def finish(self) -> None:
        """Raise ``ValueError`` unless the whole bitmap arrived and its set elements and the values match."""
        if self.received != self.mask.size:
            raise ValueError(f"the bitmap of {self.received} of {self.mask.size} elements arrived")
        if self._pending:
            raise ValueError("the mask has fewer set elements than there are values")
        if self._position != self.mask.size:
            raise ValueError("the mask has more set elements than there are values")


def compile_loops() -> None:
    """Compile the loops for the arrays a decoder calls them with: a read-only bitmap and read-only values
    (views of a message), float32 or 16-bit with a table. Other kinds compile on first use."""
    table = np.zeros(1 << 16, dtype=np.uint32)
    for kind in (None, table):
        bitmap = np.array([1], dtype=np.uint8)
        values = np.ones(1, dtype=np.float32 if kind is None else np.uint16)
        for array in (bitmap, values):
            array.setflags(write=False)
        expansion = Expansion(2, kind)
        expansion.add(bitmap, 2, values)
        expansion.finish()
