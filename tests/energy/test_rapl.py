"""RAPL on fake powercap trees: which zones count, counter wraps, unreadable files."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from edge_node.energy import RaplMeter, open_meter
from edge_node.errors import MeterUnavailable

MAX_UJ = 262_143_328_850  # a real package max_energy_range_uj


def _zone(root: Path, zone: str, name: str, energy_uj: int, max_uj: int = MAX_UJ) -> Path:
    path = root / "sys/class/powercap" / zone
    path.mkdir(parents=True)
    (path / "name").write_text(f"{name}\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return path / "energy_uj"


def _set(path: Path, energy_uj: int) -> None:
    path.write_text(f"{energy_uj}\n")


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, Path]:
    """A two-socket server with core/uncore subzones, DRAM, a psys zone and an MMIO duplicate."""
    return {
        "pkg0": _zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000),
        "core0": _zone(tmp_path, "intel-rapl:0:0", "core", 500_000),
        "dram0": _zone(tmp_path, "intel-rapl:0:1", "dram", 2_000_000, max_uj=65_712_999_613),
        "pkg1": _zone(tmp_path, "intel-rapl:1", "package-1", 3_000_000),
        "psys": _zone(tmp_path, "intel-rapl:2", "psys", 9_000_000),
        "mmio": _zone(tmp_path, "intel-rapl-mmio:0", "package-0", 7_000_000),
    }


def test_counts_packages_and_dram_only(tmp_path: Path, tree: dict[str, Path]) -> None:
    with RaplMeter(tmp_path, poll_interval_s=None) as meter:
        assert meter.source == "rapl" and meter.measured
        assert sorted(z.name for z in meter.zones) == ["dram", "package-0", "package-1"]
        assert meter.read().energy_j == 0.0
        _set(tree["pkg0"], 1_000_000 + 3_000_000)  # +3 J
        _set(tree["dram0"], 2_000_000 + 500_000)  # +0.5 J
        _set(tree["pkg1"], 3_000_000 + 1_500_000)  # +1.5 J
        for name in ("core0", "psys", "mmio"):  # parts of the package or duplicates: must not count
            _set(tree[name], 10**9)
        assert meter.read().energy_j == pytest.approx(5.0)
        assert "package-0" in meter.detail and "dram" in meter.detail


def test_wrap_between_two_reads(tmp_path: Path) -> None:
    pkg = _zone(tmp_path, "intel-rapl:0", "package-0", MAX_UJ - 2_000_000)
    with RaplMeter(tmp_path, poll_interval_s=None) as meter:
        _set(pkg, 1_000_000)  # wrapped: 2 J up to the wrap point, then 1 J after it
        assert meter.read().energy_j == pytest.approx(3.0)
        _set(pkg, 4_000_000)
        assert meter.read().energy_j == pytest.approx(6.0)


def test_poll_thread_catches_a_wrap_between_phase_boundaries(tmp_path: Path) -> None:
    pkg = _zone(tmp_path, "intel-rapl:0", "package-0", int(MAX_UJ * 0.9))
    with RaplMeter(tmp_path, poll_interval_s=0.01) as meter:
        _set(pkg, int(MAX_UJ * 0.5))  # wrapped once (+0.6 max) ...
        time.sleep(0.3)  # ... seen by the poll thread ...
        _set(pkg, int(MAX_UJ * 0.95))  # ... then +0.45 max more: reading only now would see +0.05 max
        assert meter.read().energy_j == pytest.approx(1.05 * MAX_UJ / 1e6, rel=1e-6)


def test_no_powercap_is_unavailable_with_reason(tmp_path: Path) -> None:
    with pytest.raises(MeterUnavailable, match="powercap"):
        open_meter("rapl", sysfs_root=tmp_path)


def test_garbage_counter_is_unavailable(tmp_path: Path) -> None:
    pkg = _zone(tmp_path, "intel-rapl:0", "package-0", 0)
    pkg.write_text("not a number\n")
    with pytest.raises(MeterUnavailable, match="does not hold an integer"):
        RaplMeter(tmp_path, poll_interval_s=None)


def test_unreadable_energy_file_names_the_permission_fix(require_root: None) -> None:
    """Like Linux >= 5.10: energy_uj is 0400 root. An unprivileged child must get the hint."""
    root = Path(tempfile.mkdtemp(prefix="edge-node-rapl-"))
    try:
        root.chmod(0o755)
        energy = _zone(root, "intel-rapl:0", "package-0", 123)
        energy.chmod(0o400)
        with RaplMeter(root, poll_interval_s=None) as meter:  # root itself can read it
            assert meter.read().energy_j == 0.0
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: drop to nobody and try to open the meter
            message = "child failed before trying"
            try:
                os.close(read_end)
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                try:
                    open_meter("rapl", sysfs_root=root).close()
                    message = "OPENED"
                except MeterUnavailable as exc:
                    message = str(exc)
            finally:
                os.write(write_end, message.encode())
                os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end, "rb") as pipe:
            message = pipe.read().decode()
        os.waitpid(pid, 0)
    finally:
        shutil.rmtree(root)
    assert message.startswith(f"permission denied on {energy}"), message
    assert "run as root" in message and f"chmod a+r {energy}" in message and "udev rule" in message
