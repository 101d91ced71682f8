"""The controller's wheelhouse (ansible/roles/edge_node/files/prepare_wheels.py), offline.

Small made-up wheels in a local index stand in for PyPI; the script runs as the role runs it, with
pip told to use only that index and no pip configuration of this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.deploy.conftest import REPO_ROOT

pytestmark = [pytest.mark.deploy]

SCRIPT = REPO_ROOT / "ansible" / "roles" / "edge_node" / "files" / "prepare_wheels.py"


def _wheel(directory: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> Path:
    """A minimal pure-Python wheel with these ``Requires-Dist`` lines."""
    dist = name.replace("-", "_")
    path = directory / f"{dist}-{version}-py3-none-any.whl"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    metadata += "".join(f"Requires-Dist: {line}\n" for line in requires)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{dist}/__init__.py", "")
        archive.writestr(f"{dist}-{version}.dist-info/METADATA", metadata)
        wheel_file = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        archive.writestr(f"{dist}-{version}.dist-info/WHEEL", wheel_file)
        archive.writestr(f"{dist}-{version}.dist-info/RECORD", "")
    return path


@pytest.fixture
def index(tmp_path: Path) -> tuple[Path, Path]:
    """(the package's wheel, a local index): the package needs torch, dep-a, and tomli on Python < 3.11."""
    index = tmp_path / "index"
    index.mkdir()
    _wheel(index, "torch", "2.99.0")
    _wheel(index, "dep-a", "1.0", ("dep-b>=1", 'dep-c; python_version < "3.11"'))
    _wheel(index, "dep-b", "1.0")
    _wheel(index, "dep-c", "1.0")
    _wheel(index, "tomli", "2.0")
    dist = tmp_path / "dist"
    dist.mkdir()
    package = _wheel(dist, "edge-node", "0.1.0", ("torch>=2,<3", "dep-a", 'tomli>=2; python_version < "3.11"'))
    return package, index


def _fill(
    package: Path, index: Path, dest: Path, python: str, *extra: str, glibc: str = "2.36", machine: str = "x86_64"
) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # this machine's pip.conf (find-links, extra indexes) stays out
    cmd = [
        sys.executable, str(SCRIPT), "wheelhouse", "--wheel", str(package), "--dest", str(dest),
        "--machine", machine, "--glibc", glibc, "--python", python,
        "--pip-args", f"--no-index --find-links {index}", *extra,
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout)


def _names(result: dict) -> set[str]:
    return {name.split("-", 1)[0] for name in result["files"]}


def test_wheelhouse_follows_the_targets_markers_not_the_controllers(index: tuple[Path, Path], tmp_path: Path) -> None:
    """A 3.10 host needs tomli and dep-c; pip, running on the controller's Python, would leave them out."""
    package, idx = index
    old = _fill(package, idx, tmp_path / "cp310", "3.10")
    new = _fill(package, idx, tmp_path / "cp312", "3.12")
    assert _names(old) == {"edge_node", "torch", "dep_a", "dep_b", "dep_c", "tomli"}
    assert _names(new) == {"edge_node", "torch", "dep_a", "dep_b"}


def test_what_only_the_controllers_cpu_needs_stays_out(index: tuple[Path, Path], tmp_path: Path) -> None:
    """torch 2.10's CUDA libraries are marked x86_64: pip, judging markers on an x86_64 controller, downloads
    their aarch64 builds too (3 GB of a 3.2 GB wheelhouse for a Raspberry Pi); the wheelhouse drops them."""
    package, idx = index
    _wheel(idx, "torch", "2.98.0", ('cuda-libs; platform_machine == "x86_64"',))
    _wheel(idx, "cuda-libs", "1.0")
    pinned = ("--requirement", "torch==2.98.0")
    arm = _fill(package, idx, tmp_path / "cp311-aarch64", "3.11", *pinned, machine="aarch64")
    x86 = _fill(package, idx, tmp_path / "cp311-x86_64", "3.11", *pinned)
    assert _names(arm) == {"edge_node", "torch", "dep_a", "dep_b"}
    assert _names(x86) == {"edge_node", "torch", "dep_a", "dep_b", "cuda_libs"}
    with tarfile.open(arm["archive"]) as archive:
        assert not any(name.startswith("cuda_libs") for name in archive.getnames())


def test_excluded_distribution_stays_out_and_same_inputs_change_nothing(
    index: tuple[Path, Path], tmp_path: Path
) -> None:
    """--exclude torch (a Jetson's comes from the system); a second fill with the same inputs is a no-op."""
    package, idx = index
    first = _fill(package, idx, tmp_path / "wh", "3.11", "--exclude", "torch")
    assert _names(first) == {"edge_node", "dep_a", "dep_b"}
    assert first["changed"] is True
    with tarfile.open(first["archive"]) as archive:
        assert sorted(archive.getnames()) == first["files"]  # what the host unpacks
    second = _fill(package, idx, tmp_path / "wh", "3.11", "--exclude", "torch")
    assert second["changed"] is False
    assert second["manifest"] == first["manifest"]


def test_each_glibc_gets_its_own_archive(index: tuple[Path, Path], tmp_path: Path) -> None:
    """The archive is named after the whole wheelhouse directory (glibc 2.36 and 2.31 must not share one)."""
    package, idx = index
    a = _fill(package, idx, tmp_path / "cp311-x86_64-glibc2.36", "3.11", glibc="2.36")
    b = _fill(package, idx, tmp_path / "cp311-x86_64-glibc2.31", "3.11", glibc="2.31")
    assert a["archive"] != b["archive"]
    assert Path(a["archive"]).name == "cp311-x86_64-glibc2.36.tar"
    assert Path(a["archive"]).is_file() and Path(b["archive"]).is_file()


def test_a_users_package_and_its_dependencies_join_the_wheelhouse(index: tuple[Path, Path], tmp_path: Path) -> None:
    """--wheel twice: edge-node's and a user's package (its model and data factories) with its own dependency."""
    package, idx = index
    _wheel(idx, "dep-d", "1.0")
    plugin = _wheel(tmp_path / "dist", "my-plugin", "1.0", ("dep-d", "dep-b>=1"))
    result = _fill(package, idx, tmp_path / "wh", "3.11", "--wheel", str(plugin), "--exclude", "torch")
    assert _names(result) == {"edge_node", "my_plugin", "dep_a", "dep_b", "dep_d"}
    with tarfile.open(result["archive"]) as archive:
        assert "my_plugin-1.0-py3-none-any.whl" in archive.getnames()


def test_the_wheel_of_a_users_source_folder_is_built(tmp_path: Path) -> None:
    """``wheel --source`` builds any project, not only edge-node: here the worked example of the README."""
    cmd = [sys.executable, str(SCRIPT), "wheel", "--source", str(REPO_ROOT / "examples" / "digits_tabular"),
           "--dest", str(tmp_path / "plugins")]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    built = json.loads(result.stdout)
    assert Path(built["wheel"]).name == "edge_node_digits_tabular-0.1.0-py3-none-any.whl" and built["changed"]
    with zipfile.ZipFile(built["wheel"]) as archive:
        names = archive.namelist()
        entry_points = archive.read("edge_node_digits_tabular-0.1.0.dist-info/entry_points.txt").decode()
    assert "digits_tabular/model.py" in names and "digits-mlp = digits_tabular:mlp" in entry_points
    again = json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout)
    assert again == {"wheel": built["wheel"], "changed": False}
