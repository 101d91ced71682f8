"""A received tensor built chunk by chunk on builder threads while the rest of its stream arrives.

The decoder checks each chunk against the stream on the receiving thread and hands its bytes to
the tensor's ``TensorBuild``; the builds run on ``BUILDERS`` (kept daemon threads, one per CPU but one), each
tensor's chunks in order, different tensors at once. A pull's last message then leaves only its own
chunks to expand, not the whole of the tensors it completes (about 1.2 ms of a ResNet18 pull when a
tensor was built only once complete).
"""

from __future__ import annotations

import collections
import math
import os
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np
import torch

from edge_node.errors import WireDecodeError
from edge_node.threads import KeptThreads
from edge_node.wire.spec import ValueType

if TYPE_CHECKING:
    from edge_node.wire._expand import Expansion

Built = tuple[torch.Tensor, torch.Tensor]  # a tensor's float32 weights and bool mask, in its shape


def _builder_count() -> int:
    """One builder per CPU this process may run on, less the one the receiving threads need.

    On this project's 2-core machine one builder pulled a ResNet18 model in 18.8-20.6 ms against
    20.3-25.0 ms with two (four processes each): a second builder only took CPU from the receiving
    thread and gRPC's, and builds already overlap the stream.
    """
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    return max(1, cpus - 1)


BUILDERS = KeptThreads("edge-node-build", max_threads=_builder_count())


class TensorBuild:
    """One tensor's chunks checked (finite values, bitmap, counts) and expanded in arrival order.

    ``future`` holds the float32 weights and bool mask (None when dense) once the last chunk is in,
    or the tensor's ``WireDecodeError``, set as soon as a chunk is refused (later chunks are then
    dropped). The decoder has already checked each chunk's ranges and sizes against the stream.
    """

    def __init__(self, name: str, shape: tuple[int, ...], dense: bool, value_type: ValueType) -> None:
        self.name = name
        self.shape = shape
        self.numel = math.prod(shape)
        self.dense = dense
        self.value_type = value_type
        self.future: Future[Built] = Future()
        self._queue: collections.deque[tuple[bytes | memoryview, bytes | memoryview, int]] = collections.deque()
        self._lock = threading.Lock()
        self._scheduled = False  # a builder job for this tensor is queued or running
        self._draining = False  # a thread (a builder, or a helper: ``build_here``) is taking the chunks
        self._weight: np.ndarray | None = None  # dense: filled in order
        self._filled = 0
        self._expansion: Expansion | None = None  # sparse: made by the first chunk
        self._cancelled = False

    def cancel(self) -> None:
        """Drop the chunks not yet built: the stream was refused or abandoned, nobody will read this tensor.

        A chunk being built runs to its end (bounded work); ``future`` may then stay pending.
        """
        with self._lock:
            self._cancelled = True
            self._queue.clear()

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @property
    def idle(self) -> bool:
        """No thread is taking this tensor's chunks and none is about to."""
        return not (self._scheduled or self._draining)

    def add(self, bitmap: bytes | memoryview, values: bytes | memoryview, count: int) -> None:
        """The tensor's next chunk: its bitmap (empty when dense), values, and elements covered."""
        with self._lock:
            if self._cancelled:
                return
            self._queue.append((bitmap, values, count))
            if self._scheduled or self._draining:  # the job queued, or the thread draining, takes it in turn
                return
            self._scheduled = True
        BUILDERS.submit(self._drain_job)

    def build_here(self) -> None:
        """Take this tensor's queued chunks on the calling thread, unless another thread is taking them.

        The decoder calls it at the stream's end for the tensors still waiting, so that the receiving
        thread builds the last tensors beside the builder instead of only waiting for it.
        """
        self._take_turn(job=False)

    def _drain_job(self) -> None:
        self._take_turn(job=True)

    def _take_turn(self, *, job: bool) -> None:
        """Build the queued chunks on this thread unless another thread is at it (a builder's job, or a
        helper: ``build_here``). A job first marks itself run, so that a chunk added later gets a job of
        its own unless a thread is still draining."""
        with self._lock:
            if job:
                self._scheduled = False
            if self._draining or not self._queue:  # the thread at it takes what is queued
                return
            self._draining = True
        self._drain()

    def _drain(self) -> None:
        """Build queued chunks in order until none is left (the caller has set ``_draining``)."""
        while True:
            with self._lock:
                if not self._queue:
                    self._draining = False
                    return
                bitmap, values, count = self._queue.popleft()
            if self.future.done():  # refused already
                continue
            try:
                self._take(bitmap, values, count)
            except BaseException as exc:  # the decoder raises it from the future
                self.future.set_exception(exc)

    def _take(self, bitmap: bytes | memoryview, raw_values: bytes | memoryview, count: int) -> None:
        from edge_node.wire import _expand  # numba loads with the first decode: see compile_decoder

        values = np.frombuffer(raw_values, dtype=_expand.BITS[self.value_type])
        if self.dense:
            if self._weight is None:
                self._weight = np.empty(self.numel, dtype=np.float32)
            place = self._weight[self._filled : self._filled + values.size]
            self._refuse_non_finite(_expand.fill_dense(values, place, self.value_type))
            self._filled += values.size
            if self._filled == self.numel:
                self._hand_over(self._weight, np.ones(self.numel, dtype=np.bool_))
            return
        if self._expansion is None:
            self._expansion = _expand.Expansion(self.numel, self.value_type)
        expansion = self._expansion
        bits = np.frombuffer(bitmap, dtype=np.uint8)
        last = expansion.received + count == self.numel
        if last and count % 8 and int(bits[-1]) >> (count % 8):
            raise WireDecodeError(f"tensor {self.name!r}: bitmap has bits set beyond its {self.numel} elements")
        self._refuse_non_finite(expansion.add(bits, count, values))
        if not last:
            return
        try:
            expansion.finish()
        except ValueError:
            active = int(np.count_nonzero(expansion.mask))
            raise WireDecodeError(
                f"tensor {self.name!r}: bitmap has {active} active elements but {expansion.values} values arrived"
            ) from None
        self._hand_over(expansion.weight, expansion.mask.view(np.bool_))

    def _refuse_non_finite(self, count: int) -> None:
        if count:
            raise WireDecodeError(f"tensor {self.name!r}: {count} values are NaN or Inf")

    def _hand_over(self, weight: np.ndarray, mask: np.ndarray) -> None:
        """The tensor as the decoder hands it on, made here: on a builder this overlaps the stream, where
        the decoder's ``finish`` would do it after the last message (0.5 ms of a ResNet18 pull's tail).
        A dense mask is numpy's fill: torch's would wake its OpenMP workers, which then spin for a while."""
        self.future.set_result(
            (torch.from_numpy(weight).reshape(self.shape), torch.from_numpy(mask).reshape(self.shape))
        )
