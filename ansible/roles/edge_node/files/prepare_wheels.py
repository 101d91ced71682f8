#!/usr/bin/env python3
"""Controller side of the edge_node role: build the package's wheel, fill a wheelhouse for a target.

    prepare_wheels.py wheel --source CHECKOUT --dest DIR
        Build edge-node's wheel from the checkout's files (tracked and untracked-but-not-ignored when
        it is a git checkout) in a scratch copy, so stale build/ output never enters the wheel, with
        SOURCE_DATE_EPOCH fixed so that the same sources give the same bytes (and the hosts' copies
        stay unchanged). Prints JSON: {"wheel": PATH, "changed": BOOL}.

    prepare_wheels.py wheelhouse --wheel W --dest DIR --machine aarch64 --glibc 2.36 --python 3.11
                                 [--requirement torch==2.13.0] [--pip-args "..."]
        Put W and every wheel it needs on that target (CPU, glibc, CPython version) into DIR with
        pip download --only-binary=:all:. When DIR already has them (checked offline first) nothing
        is downloaded; DIR.tar holds them all (for one transfer). Prints JSON: {"dir": DIR,
        "archive": DIR.tar, "files": [...], "manifest": "SHA256  NAME\\n...", "changed": BOOL}.

Run with the controller's Python (it needs pip). Exit 1 with the failing command's output on error.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

SOURCE_DATE_EPOCH = "315532800"  # 1980-01-01, the earliest time a zip entry can carry
_IGNORED = (".git", ".venv", "build", "dist", "__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if result.returncode != 0:
        sys.stderr.write(f"{shlex.join(cmd)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
        raise SystemExit(1)
    return result


def _copy_sources(source: Path, scratch: Path) -> None:
    """The checkout's files as git sees them (tracked or untracked, not ignored); else all but build output."""
    listing = subprocess.run(
        ["git", "-C", str(source), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
    )
    if listing.returncode != 0:
        shutil.copytree(source, scratch, ignore=shutil.ignore_patterns(*_IGNORED), dirs_exist_ok=True)
        return
    for name in sorted(set(listing.stdout.decode().split("\0")) - {""}):
        src = source / name
        if src.is_file():  # a tracked file deleted in the work tree is not shipped
            (scratch / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, scratch / name)


def build_wheel(source: Path, dest: Path) -> dict[str, object]:
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edge-node-wheel-") as tmp:
        scratch, out = Path(tmp) / "src", Path(tmp) / "dist"
        scratch.mkdir()
        _copy_sources(source, scratch)
        env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(scratch)]
        # The controller's own setuptools when it is new enough (seconds faster), else an isolated build.
        if subprocess.run([*cmd, "--no-build-isolation"], capture_output=True, env=env).returncode != 0:
            _run(cmd, env=env)
        (built,) = out.glob("edge_node-*.whl")
        target = dest / built.name
        changed = not target.exists() or _sha256(target) != _sha256(built)
        if changed:
            shutil.move(str(built), target)
    return {"wheel": str(target), "changed": changed}


def _platforms(machine: str, glibc: str) -> list[str]:
    """pip download takes platform tags literally: list every manylinux tag the target's glibc runs."""
    major, minor = (int(part) for part in glibc.split(".")[:2])
    if major != 2:
        raise SystemExit(f"unexpected glibc version {glibc!r}")
    tags = [f"manylinux_2_{m}_{machine}" for m in range(minor, 16, -1)]
    return [*tags, f"manylinux2014_{machine}"]


def fill_wheelhouse(
    wheel: Path, dest: Path, machine: str, glibc: str, python: str, requirements: list[str], pip_args: str
) -> dict[str, object]:
    dest.mkdir(parents=True, exist_ok=True)
    before = {p.name: p.stat().st_mtime_ns for p in dest.glob("*.whl")}
    local = dest / wheel.name  # this build's bytes, even when a wheel of the same version is there
    if not local.exists() or _sha256(local) != _sha256(wheel):
        shutil.copy2(wheel, local)
    version = python.replace(".", "")
    target = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp", "--abi", f"cp{version}"]
    for tag in _platforms(machine, glibc):
        target += ["--platform", tag]
    wanted = [str(local), *requirements]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "-d", str(dest)]
    offline = subprocess.run([*cmd, *target, "--no-index", "--find-links", str(dest), *wanted], capture_output=True)
    if offline.returncode != 0:
        _run([*cmd, *target, *shlex.split(pip_args), *wanted])
    after = {p.name: p.stat().st_mtime_ns for p in dest.glob("*.whl")}
    # What the host must hold: it compares this with the manifest it kept from the last copy, so an
    # unchanged wheelhouse costs one stat instead of a checksum of every wheel on both sides.
    manifest = "".join(f"{_sha256(dest / name)}  {name}\n" for name in sorted(after))
    archive = _archive(dest, sorted(after), manifest)
    return {
        "dir": str(dest),
        "archive": str(archive),
        "files": sorted(after),
        "manifest": manifest,
        "changed": after != before,
    }


def _archive(dest: Path, names: list[str], manifest: str) -> Path:
    """``DEST.tar``: the wheels in one file (one transfer instead of one per wheel), rebuilt on change."""
    archive, stamp = dest.with_suffix(".tar"), dest.with_suffix(".tar.manifest")
    if archive.exists() and stamp.exists() and stamp.read_text() == manifest:
        return archive
    tmp = archive.with_suffix(".tar.tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            info = tar.gettarinfo(str(dest / name), arcname=name)
            info.mtime, info.mode, info.uid, info.gid, info.uname, info.gname = 0, 0o644, 0, 0, "root", "root"
            with open(dest / name, "rb") as handle:
                tar.addfile(info, handle)
    tmp.replace(archive)
    stamp.write_text(manifest)
    return archive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_wheel = sub.add_parser("wheel", help="build the package's wheel from a checkout")
    p_wheel.add_argument("--source", type=Path, required=True)
    p_wheel.add_argument("--dest", type=Path, required=True)
    p_house = sub.add_parser("wheelhouse", help="download every wheel a target needs")
    p_house.add_argument("--wheel", type=Path, required=True)
    p_house.add_argument("--dest", type=Path, required=True)
    p_house.add_argument("--machine", required=True, help="the target's CPU, as uname -m says (x86_64, aarch64)")
    p_house.add_argument("--glibc", required=True, help="the target's glibc version, e.g. 2.36")
    p_house.add_argument("--python", required=True, help="the target's CPython version, e.g. 3.11")
    p_house.add_argument("--requirement", action="append", default=[], help="another requirement (repeatable)")
    p_house.add_argument("--pip-args", default="", help="extra pip download arguments (index URLs)")
    args = parser.parse_args(argv)
    if args.command == "wheel":
        result = build_wheel(args.source.resolve(), args.dest.resolve())
    else:
        requirements = [r for r in args.requirement if r]
        result = fill_wheelhouse(
            args.wheel.resolve(),
            args.dest.resolve(),
            args.machine,
            args.glibc,
            args.python,
            requirements,
            args.pip_args,
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
