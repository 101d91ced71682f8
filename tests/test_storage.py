"""Durable writes: a failed write raises StorageError, leaves the old file intact and no debris."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_node.errors import StorageError
from edge_node.storage import append_line, atomic_write, atomic_write_text


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_atomic_write_replaces_or_keeps_the_old_file(tmp_path: Path, monkeypatch):
    target = tmp_path / "state.json"
    atomic_write_text(target, "old\n")
    assert target.read_text() == "old\n"

    def half_then_fail(handle):
        handle.write(b"new but cut sh")
        _enospc()

    with pytest.raises(StorageError, match=r"cannot write .*state\.json: No space left on device"):
        atomic_write(target, half_then_fail)
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]  # the .tmp is gone


def test_an_interrupt_inside_torch_save_is_an_interrupt_not_a_storage_error(tmp_path: Path):
    """Ctrl-C while torch.save writes surfaces as its zip writer's RuntimeError ("unexpected pos ..."): a run
    stopped by SIGINT while it checkpointed exited 4 (storage) instead of 130. The old file stays."""
    import io

    import torch

    path = tmp_path / "checkpoint.pt"
    atomic_write_text(path, "old")

    class InterruptedFile(io.RawIOBase):  # the file torch.save writes to; SIGINT's handler raises mid-write
        def __init__(self, handle: io.BufferedWriter) -> None:
            self.handle, self.written = handle, 0

        def writable(self) -> bool:
            return True

        def write(self, data: bytes) -> int:  # type: ignore[override]
            self.written += len(data)
            if self.written > 2000:
                raise KeyboardInterrupt
            return self.handle.write(data)

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, lambda handle: torch.save({"w": torch.zeros(10_000)}, InterruptedFile(handle)))
    assert path.read_text() == "old" and not path.with_name("checkpoint.pt.tmp").exists()


def test_append_line_cuts_a_torn_write_back(tmp_path: Path, monkeypatch):
    log = tmp_path / "rounds.jsonl"
    append_line(log, json.dumps({"round": 0}))
    monkeypatch.setattr(os, "fsync", _enospc)  # the data reached the file, then the sync failed
    with pytest.raises(StorageError, match="rounds.jsonl"):
        append_line(log, json.dumps({"round": 1}))
    monkeypatch.undo()
    assert log.read_text() == '{"round": 0}\n'


def test_unwritable_directory_is_a_storage_error(tmp_path: Path):
    with pytest.raises(StorageError, match="cannot write"):
        append_line(tmp_path / "missing-dir" / "energy.jsonl", "{}")


SIM = [
    sys.executable, "-m", "edge_node", "simulate", "--dataset", "demo", "--clients", "4", "--neighbours", "2",
    "--rounds", "3", "--epochs", "1", "--samples-per-client", "100", "--no-progress", "--energy-backend", "estimate",
]  # fmt: skip


def test_a_full_disk_stops_the_run_cleanly_and_it_resumes_to_the_same_result(tmp_path: Path, require_root):
    """A real tmpfs too small for the second checkpoint (the atomic replace needs two): exit 4, one line,
    the first round kept; with more room the same command resumes and matches a straight run."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20M", "tmpfs", str(mnt)], check=True)
    try:
        out = mnt / "run"
        proc = subprocess.run([*SIM, "--output", str(out)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 4, proc.stderr
        error = proc.stderr.strip().splitlines()[-1]
        assert error.startswith("edge-node: error: cannot write") and "checkpoint.pt" in error, proc.stderr
        assert "full or nearly" in error
        assert not (out / "checkpoint.pt.tmp").exists()
        kept = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
        assert [r["round"] for r in kept][:1] == [0]
        subprocess.run(["mount", "-o", "remount,size=64M", str(mnt)], check=True)
        proc = subprocess.run([*SIM, "--output", str(out)], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        resumed = [json.loads(line) for line in (out / "rounds.jsonl").read_text().splitlines()]
    finally:
        subprocess.run(["umount", str(mnt)], check=True)
    straight = tmp_path / "straight"
    assert subprocess.run([*SIM, "--output", str(straight)], capture_output=True, timeout=300).returncode == 0
    records = [json.loads(line) for line in (straight / "rounds.jsonl").read_text().splitlines()]

    def strip(rs):
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in rs]

    assert strip(resumed) == strip(records)
