"""Fleet tests: shared settings, and a check before and after each test that nothing of ours is left behind.

Every process a fleet test starts carries ``EDGE_NODE_TEST_MARK`` in its environment (daemons inherit
it, also when their supervisor dies and they are re-parented), so leftovers are found by that mark and
never by a name. Namespaces are ours when their name carries a pid of ours (``en-<kind>-<pid>-``) or
of a process that is gone; qdiscs (``tbf``/``netem``) and iptables rules (comment ``edge-node-loopback``)
of ours would only show in the machine's own namespace if they escaped the fleet's: none may. Device
cgroups (``en-<kind>-<pid>-`` directories in the cpu and memory hierarchies) are ours by the same rule.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from edge_node.fleet import cgroups as _cgroups
from edge_node.fleet import netns as _netns
from edge_node.fleet.link import IPTABLES_COMMENT

MARK = "EDGE_NODE_TEST_MARK"


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One decoded-data cache for every daemon of the session (EDGE_NODE_CACHE)."""
    cache = tmp_path_factory.mktemp("edge-node-cache")
    old = os.environ.get("EDGE_NODE_CACHE")
    os.environ["EDGE_NODE_CACHE"] = str(cache)
    yield cache
    if old is None:
        os.environ.pop("EDGE_NODE_CACHE", None)
    else:
        os.environ["EDGE_NODE_CACHE"] = old


def _marked(mark: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get(MARK) == mark:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _ours(ns: str, mark: str) -> bool:
    pid = _netns.creator_pid(ns)
    if pid is None:
        return False
    if pid == os.getpid():
        return True
    try:
        return psutil.Process(pid).environ().get(MARK) == mark
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return True  # its creator is gone: a leftover


def _root_state() -> tuple[set[str], set[str]]:
    """Shaping qdiscs and our iptables rules in the machine's own namespace.

    Without ``tc`` or ``iptables-save`` on PATH there is nothing of that kind to list: the fleet runs the
    same programs (from PATH) and refuses a ``--link`` that needs a missing one before shaping anything.
    """
    if os.geteuid() != 0:
        return set(), set()
    shaping: set[str] = set()
    ours: set[str] = set()
    if shutil.which("tc") is not None:
        qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True, timeout=10).stdout
        shaping = {line for line in qdiscs.splitlines() if re.search(r"\b(tbf|netem)\b", line)}
    if shutil.which("iptables-save") is not None:
        rules = subprocess.run(["iptables-save"], capture_output=True, text=True, timeout=10).stdout
        ours = {line for line in rules.splitlines() if IPTABLES_COMMENT in line}
    return shaping, ours


@pytest.fixture(autouse=True)
def no_leftovers(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Mark this test's processes; after it (also when it failed) none of them, and no namespace of ours, remains."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK, mark)
    namespaces_before = set(_netns.list_namespaces()) if os.geteuid() == 0 else set()
    hierarchy = _cgroups.system_hierarchy() if os.geteuid() == 0 else None
    groups_before = set(_cgroups.our_groups(hierarchy)) if hierarchy is not None else set()
    shaping_before, rules_before = _root_state()
    yield {"mark": mark}
    problems = []
    procs = _marked(mark)
    if procs:
        problems.append(f"processes left running: {[(p.pid, ' '.join(p.cmdline()[:6])) for p in procs]}")
        for proc in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(procs, timeout=10)
    if os.geteuid() == 0:
        left = [ns for ns in set(_netns.list_namespaces()) - namespaces_before if _ours(ns, mark)]
        if left:
            problems.append(f"namespaces left: {sorted(left)}")
            for ns in left:
                _netns.delete_namespace(ns)
        if hierarchy is not None:
            groups = [d for d in set(_cgroups.our_groups(hierarchy)) - groups_before if _ours(d.name, mark)]
            if groups:
                problems.append(f"cgroups left: {sorted(map(str, groups))}")
                for d in groups:
                    _cgroups.remove_group(_cgroups.DeviceGroup(d.name, (d,), hierarchy.version))
        shaping, rules = _root_state()
        if shaping - shaping_before:
            problems.append(f"qdiscs left in the machine's namespace: {sorted(shaping - shaping_before)}")
        if rules - rules_before:
            problems.append(f"iptables rules left in the machine's namespace: {sorted(rules - rules_before)}")
    assert not problems, "; ".join(problems)
