#!/usr/bin/env python3
"""Controller side of the edge_node role: build the package's wheel, fill a wheelhouse for a target.

    prepare_wheels.py wheel --source CHECKOUT --dest DIR
        Build the wheel of a project (edge-node's checkout, or a user's package with its model and data
        factories) from its files (tracked and untracked-but-not-ignored when
        it is a git checkout) in a scratch copy, so stale build/ output never enters the wheel, with
        SOURCE_DATE_EPOCH fixed so that the same sources give the same bytes (and the hosts' copies
        stay unchanged); sources identical to the last build's are not built again. Prints JSON:
        {"wheel": PATH, "changed": BOOL}.

    prepare_wheels.py wheelhouse --wheel W [--wheel W2 ...] --dest DIR --machine aarch64 --glibc 2.36
                                 --python 3.11 [--requirement torch==2.13.0] [--exclude torch] [--pip-args "..."]
        Put W (edge-node's wheel, and the wheels W2... of a user's packages) and every wheel they need
        on that target (CPU, glibc, CPython version) into DIR with
        pip download --only-binary=:all:. pip judges environment markers by the Python running it,
        not the target's, so the wheels' requirements are then read again with the target's markers
        (tomli; python_version < "3.11" on a 3.10 target) and what is missing is downloaded too.
        --exclude NAME leaves a distribution out (a Jetson's torch comes from the system, not the
        wheelhouse). When DIR holds what the same inputs gave last time (DIR.inputs.json) nothing is
        resolved again; DIR.tar holds the wheels (one transfer). Prints JSON: {"dir": DIR,
        "archive": DIR.tar, "files": [...], "manifest": "SHA256  NAME\\n...", "changed": BOOL}.

Run with the controller's Python (it needs pip). Exit 1 with the failing command's output on error.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

try:  # ansible-core depends on packaging; pip carries a copy otherwise
    from packaging.requirements import InvalidRequirement, Requirement
except ImportError:  # pragma: no cover
    from pip._vendor.packaging.requirements import InvalidRequirement, Requirement  # type: ignore[no-redef]

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


def _tree_digest(root: Path) -> str:
    """sha256 over a tree's files: relative path, executable bit and content."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(root)}\0{os.access(path, os.X_OK)}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def build_wheel(source: Path, dest: Path) -> dict[str, object]:
    """Build the wheel unless ``dest`` holds the one these very sources gave (``dest/.wheel-sources.json``)."""
    dest.mkdir(parents=True, exist_ok=True)
    stamp = dest / ".wheel-sources.json"
    with tempfile.TemporaryDirectory(prefix="edge-node-wheel-") as tmp:
        scratch, out = Path(tmp) / "src", Path(tmp) / "dist"
        scratch.mkdir()
        _copy_sources(source, scratch)
        # The build is reproducible (SOURCE_DATE_EPOCH), so the same sources and builder give the same bytes.
        inputs = {"sources": _tree_digest(scratch), "python": sys.version, "epoch": SOURCE_DATE_EPOCH}
        recorded = json.loads(stamp.read_text()) if stamp.exists() else {}
        kept = dest / str(recorded.get("wheel", "-"))
        if recorded.get("inputs") == inputs and kept.is_file() and _sha256(kept) == recorded.get("sha256"):
            return {"wheel": str(kept), "changed": False}
        env = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(scratch)]
        # The controller's own setuptools when it is new enough (seconds faster), else an isolated build.
        if subprocess.run([*cmd, "--no-build-isolation"], capture_output=True, env=env).returncode != 0:
            _run(cmd, env=env)
        (built,) = out.glob("*.whl")
        target = dest / built.name
        changed = not target.exists() or _sha256(target) != _sha256(built)
        if changed:
            shutil.move(str(built), target)
    stamp.write_text(json.dumps({"inputs": inputs, "wheel": target.name, "sha256": _sha256(target)}) + "\n")
    return {"wheel": str(target), "changed": changed}


def _platforms(machine: str, glibc: str) -> list[str]:
    """pip download takes platform tags literally: list every manylinux tag the target's glibc runs."""
    major, minor = (int(part) for part in glibc.split(".")[:2])
    if major != 2:
        raise SystemExit(f"unexpected glibc version {glibc!r}")
    tags = [f"manylinux_2_{m}_{machine}" for m in range(minor, 16, -1)]
    return [*tags, f"manylinux2014_{machine}"]


def canonical_name(name: str) -> str:
    """A distribution name as PEP 503 compares them (``Tomli_W`` and ``tomli-w`` are one)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_name(path: Path) -> str:
    return canonical_name(path.name.split("-", 1)[0])


def _requires_dist(wheel: Path) -> list[str]:
    """The ``Requires-Dist`` lines of a wheel's METADATA."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        metadata = email.parser.BytesParser().parsebytes(archive.read(name))
    return metadata.get_all("Requires-Dist") or []


def target_environment(machine: str, python: str) -> dict[str, str]:
    """PEP 508 marker values of a Linux CPython ``python`` on ``machine`` (what the host's pip will use)."""
    return {
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": machine,
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_version": f"{python}.0",
    }


def _closure(
    dest: Path, roots: list[str], environment: dict[str, str], exclude: set[str]
) -> tuple[set[str], list[str]]:
    """What a host of ``environment`` installs from ``dest``: the wheels it needs, and the requirements
    that no wheel in ``dest`` provides.

    Walks from ``roots`` (requirement strings, or paths of wheels in ``dest``) through the wheels'
    ``Requires-Dist``, evaluating each marker for the target with the extras asked of that distribution.
    """
    wheels: dict[str, Path] = {_wheel_name(p): p for p in dest.glob("*.whl")}
    extras: dict[str, set[str]] = {}
    queue: list[str] = []
    for root in roots:
        if root.endswith(".whl"):
            queue.append(_wheel_name(Path(root)))
            extras.setdefault(queue[-1], set())
            continue
        req = Requirement(root)
        if req.marker is None or req.marker.evaluate(environment | {"extra": ""}):
            queue.append(canonical_name(req.name))
            extras.setdefault(queue[-1], set()).update(req.extras)
    needed: set[str] = set()
    missing: dict[str, str] = {}
    seen: set[tuple[str, frozenset[str]]] = set()
    while queue:
        name = queue.pop()
        key = (name, frozenset(extras.get(name, set())))
        if name in exclude or key in seen:
            continue
        seen.add(key)
        if name not in wheels:
            continue  # reported by its requirer below
        needed.add(name)
        for line in _requires_dist(wheels[name]):
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            asked = [""] + sorted(extras.get(name, set()))
            if req.marker is not None and not any(req.marker.evaluate(environment | {"extra": e}) for e in asked):
                continue
            dep = canonical_name(req.name)
            if dep in exclude:
                continue
            extras.setdefault(dep, set()).update(req.extras)
            if dep not in wheels:
                missing[dep] = str(Requirement(line.split(";", 1)[0]))
            queue.append(dep)
    return needed, sorted(missing.values())


def missing_for_target(dest: Path, roots: list[str], environment: dict[str, str], exclude: set[str]) -> list[str]:
    """Requirements that a host of ``environment`` needs and no wheel in ``dest`` provides."""
    return _closure(dest, roots, environment, exclude)[1]


def unneeded_for_target(dest: Path, roots: list[str], environment: dict[str, str], exclude: set[str]) -> list[Path]:
    """Wheels in ``dest`` that a host of ``environment`` would not install.

    pip download judges markers by the controller: an x86_64 controller filling an aarch64 wheelhouse
    gets the aarch64 builds of requirements marked ``platform_machine == "x86_64"`` (torch 2.10's CUDA
    libraries: 3 GB of a 3.2 GB wheelhouse), which the device would receive and never install.
    """
    needed = _closure(dest, roots, environment, exclude)[0]
    return sorted(p for p in dest.glob("*.whl") if _wheel_name(p) not in needed)


def fill_wheelhouse(
    wheels: list[Path],
    dest: Path,
    machine: str,
    glibc: str,
    python: str,
    requirements: list[str],
    pip_args: str,
    exclude: list[str] | None = None,
) -> dict[str, object]:
    dest.mkdir(parents=True, exist_ok=True)
    before = {p.name: p.stat().st_mtime_ns for p in dest.glob("*.whl")}
    local = [dest / wheel.name for wheel in wheels]  # these builds' bytes, even over a wheel of the same version
    for wheel, copy in zip(wheels, local, strict=True):
        if not copy.exists() or _sha256(copy) != _sha256(wheel):
            shutil.copy2(wheel, copy)
    excluded = {canonical_name(name) for name in exclude or []}
    inputs = {
        "wheel": [_sha256(copy) for copy in local], "machine": machine, "glibc": glibc, "python": python,
        "requirements": requirements, "exclude": sorted(excluded), "pip_args": pip_args,
    }  # fmt: skip
    stamp = dest.parent / f"{dest.name}.inputs.json"
    recorded = json.loads(stamp.read_text()) if stamp.exists() else {}
    if recorded.get("inputs") != inputs or not all((dest / name).exists() for name in recorded.get("files", [])):
        _resolve(local, dest, machine, glibc, python, requirements, pip_args, excluded)
    for path in dest.glob("*.whl"):
        if _wheel_name(path) in excluded:
            path.unlink()  # asked for by a dependency: the host has it (the role checked it imports)
    roots = [*map(str, local), *requirements]
    for path in unneeded_for_target(dest, roots, target_environment(machine, python), excluded):
        path.unlink()  # downloaded for the controller's markers, not the target's
    after = {p.name: p.stat().st_mtime_ns for p in dest.glob("*.whl")}
    stamp.write_text(json.dumps({"inputs": inputs, "files": sorted(after)}, indent=1) + "\n")
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


def _resolve(
    local: list[Path],
    dest: Path,
    machine: str,
    glibc: str,
    python: str,
    requirements: list[str],
    pip_args: str,
    excluded: set[str],
) -> None:
    """pip download what the ``local`` wheels and ``requirements`` need on the target into ``dest`` (offline first)."""
    version = python.replace(".", "")
    target = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp", "--abi", f"cp{version}"]
    for tag in _platforms(machine, glibc):
        target += ["--platform", tag]
    if excluded:  # the packages' own requirements less the excluded ones (pip download cannot skip one)
        wanted = [r for w in local for r in _requires_dist(w) if canonical_name(Requirement(r).name) not in excluded]
    else:
        wanted = [str(w) for w in local]
    wanted += [r for r in requirements if canonical_name(Requirement(r).name) not in excluded]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "-d", str(dest)]
    offline = [*cmd, *target, "--no-index", "--find-links", str(dest)]
    online = [*cmd, *target, *shlex.split(pip_args)]
    if subprocess.run([*offline, *wanted], capture_output=True).returncode != 0:
        _run([*online, *wanted])
    environment = target_environment(machine, python)
    for _ in range(10):  # each pass adds what the target's markers ask for beyond the controller's
        missing = missing_for_target(dest, [*map(str, local), *requirements], environment, excluded)
        if not missing:
            return
        if subprocess.run([*offline, *missing], capture_output=True).returncode != 0:
            _run([*online, *missing])
    raise SystemExit(f"wheelhouse {dest}: still missing for the target after 10 passes: {missing}")


def _archive(dest: Path, names: list[str], manifest: str) -> Path:
    """``DEST.tar``: the wheels in one file (one transfer instead of one per wheel), rebuilt on change."""
    # Not with_suffix: "cp311-x86_64-glibc2.36" would become "...glibc2.tar" for every glibc 2.x.
    archive, stamp = dest.parent / f"{dest.name}.tar", dest.parent / f"{dest.name}.tar.manifest"
    if archive.exists() and stamp.exists() and stamp.read_text() == manifest:
        return archive
    tmp = dest.parent / f"{dest.name}.tar.tmp"
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
    p_wheel = sub.add_parser("wheel", help="build a project's wheel from its source folder")
    p_wheel.add_argument("--source", type=Path, required=True)
    p_wheel.add_argument("--dest", type=Path, required=True)
    p_house = sub.add_parser("wheelhouse", help="download every wheel a target needs")
    p_house.add_argument("--wheel", type=Path, action="append", required=True, help="a wheel to install (repeatable)")
    p_house.add_argument("--dest", type=Path, required=True)
    p_house.add_argument("--machine", required=True, help="the target's CPU, as uname -m says (x86_64, aarch64)")
    p_house.add_argument("--glibc", required=True, help="the target's glibc version, e.g. 2.36")
    p_house.add_argument("--python", required=True, help="the target's CPython version, e.g. 3.11")
    p_house.add_argument("--requirement", action="append", default=[], help="another requirement (repeatable)")
    p_house.add_argument("--exclude", action="append", default=[], help="distributions to leave out (NAME[,NAME])")
    p_house.add_argument("--pip-args", default="", help="extra pip download arguments (index URLs)")
    args = parser.parse_args(argv)
    if args.command == "wheel":
        result = build_wheel(args.source.resolve(), args.dest.resolve())
    else:
        requirements = [r for r in args.requirement if r]
        result = fill_wheelhouse(
            [wheel.resolve() for wheel in args.wheel],
            args.dest.resolve(),
            args.machine,
            args.glibc,
            args.python,
            requirements,
            args.pip_args,
            [name for arg in args.exclude for name in arg.split(",") if name],
        )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
