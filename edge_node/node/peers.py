"""What a node remembers of each peer: the last pull's result, and a jittered backoff after failures.

A peer that failed is skipped until ``retry_after``: ``base * 2**(failures - 1)`` seconds (at most ``max``),
times a random factor in [0.5, 1.5) so that a fleet does not retry a recovered peer all at once. One
success clears it. The table is bounded: peers discovery no longer lists are forgotten first.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

BASE_BACKOFF_S = 2.0
MAX_BACKOFF_S = 120.0
MAX_TRACKED = 256


@dataclass(frozen=True)
class PeerRecord:
    node_id: str
    last_result: str = ""  # "ok", or the failure kind of the last pull
    last_detail: str = ""
    last_round: int | None = None  # header round of the last snapshot received
    last_ok: float | None = None  # monotonic time of the last success
    failures: int = 0  # in a row
    retry_after: float = 0.0  # monotonic time before which the peer is skipped


class PeerTracker:
    """Thread-safe per-peer results with backoff; ``rng`` draws the jitter (a seeded one in tests)."""

    def __init__(
        self,
        rng: np.random.Generator,
        *,
        base_backoff_s: float = BASE_BACKOFF_S,
        max_backoff_s: float = MAX_BACKOFF_S,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        self._rng = rng
        self._base = base_backoff_s
        self._max = max_backoff_s
        self._max_tracked = max_tracked
        self._records: dict[str, PeerRecord] = {}
        self._lock = threading.Lock()

    def eligible(self, node_ids: list[str], now: float | None = None) -> list[str]:
        """The ``node_ids`` not in backoff now, in the given order."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return [n for n in node_ids if self._records.get(n, PeerRecord(n)).retry_after <= now]

    def success(self, node_id: str, round_index: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        with self._lock:
            old = self._records.get(node_id, PeerRecord(node_id))
            self._put(replace(old, last_result="ok", last_detail="", last_round=round_index, last_ok=now,
                              failures=0, retry_after=0.0))  # fmt: skip

    def failure(self, node_id: str, kind: str, detail: str, now: float | None = None) -> float:
        """Record a failed pull; returns the seconds the peer will be skipped."""
        now = time.monotonic() if now is None else now
        with self._lock:
            old = self._records.get(node_id, PeerRecord(node_id))
            failures = old.failures + 1
            wait_s = min(self._max, self._base * 2 ** (failures - 1)) * float(self._rng.uniform(0.5, 1.5))
            self._put(replace(old, last_result=kind, last_detail=detail[:300], failures=failures,
                              retry_after=now + wait_s))  # fmt: skip
        return wait_s

    def forget_except(self, live: set[str]) -> None:
        """Drop peers discovery no longer lists (their history is of no use once they are gone)."""
        with self._lock:
            for node_id in [n for n in self._records if n not in live]:
                del self._records[node_id]

    def records(self) -> list[PeerRecord]:
        with self._lock:
            return sorted(self._records.values(), key=lambda r: r.node_id)

    def to_json(self, now: float | None = None) -> list[dict[str, Any]]:
        now = time.monotonic() if now is None else now
        out = []
        for record in self.records():
            item = asdict(record)
            item["last_ok_age_s"] = None if record.last_ok is None else round(now - record.last_ok, 1)
            item["backoff_s"] = round(max(0.0, record.retry_after - now), 1)
            del item["last_ok"], item["retry_after"]
            out.append(item)
        return out

    def _put(self, record: PeerRecord) -> None:
        self._records[record.node_id] = record
        if len(self._records) > self._max_tracked:  # evict the longest-failing peer that never answered
            victim = max(
                (r for r in self._records.values() if r.node_id != record.node_id),
                key=lambda r: (r.last_ok is None, r.failures),
            )
            del self._records[victim.node_id]
