"""The tiny configuration the simulation's method tests run (4 clients of the demo set, two rounds), and
reading a run's records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

TINY: dict[str, Any] = dict(
    clients=4, neighbours=2, epochs=1, samples_per_client=60, batch_size=32, rounds=2, fedavg_clients=2,
    progress=False, energy_backend="estimate", seed=5,
)  # fmt: skip


def read_records(out: Path) -> list[dict[str, Any]]:
    """The run's round records, in order."""
    return [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
