"""The fleet deployment: lint, inventory checks, and a real converge onto two systemd hosts.

The hosts (tests/deploy/hosts.py) are Debian bookworm systems with systemd as PID 1, sshd and no route
to a package index, each in its own network namespace on a private bridge; ``ansible-playbook
deploy/site.yml`` reaches them over SSH with key login and installs from a wheelhouse. The daemons it
starts find each other over mDNS on that bridge and trade models.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.deploy import hosts as deploy_hosts
from tests.deploy.conftest import (
    REPO_ROOT,
    TIMINGS,
    PlaybookRun,
    ansible_env,
    ansible_tool,
    run_playbook,
    write_inventory,
)

pytestmark = [pytest.mark.deploy, pytest.mark.slow]

STATE_DIR = "/var/lib/edge-node"
ROUNDS_TIMEOUT_S = 420  # both daemons training on a shared 2-core machine
PLUGIN_MODEL = "digits-mlp"  # examples/digits_tabular's entry point (edge_node.models)
PLUGIN_DATASET = "digits_tabular:digits"  # its data factory
UNTOUCHED_PATHS = ("/opt/edge-node", "/etc/edge-node", STATE_DIR, "/etc/systemd/system/edge-node.service")
DEPLOY_PLAY = "PLAY [Install, configure and start edge-node"
# What a host keeps of a deployment after --tags uninstall -e edge_node_purge_state=true, and why. Not the
# role's doing: logging in and running anything leaves these. Every other path must be as before.
LEFTOVERS = {
    "var/log/": "logs: the journal (the daemon's log lines among them), wtmp, lastlog",
    "var/lib/systemd/": "systemd's own state (random seed, timers, unit bookkeeping)",
    "tmp/": "temporary files",
    "var/tmp/": "temporary files",
    "root/.ansible/": "Ansible's own remote temporary directory",
    "etc/passwd-": "shadow's backup of the account file before the user was removed (names edge-node)",
    "etc/group-": "the same for groups",
    "etc/shadow-": "the same for passwords",
    "etc/gshadow-": "the same for group passwords",
}
# An extra environment value the unit must hand to the daemon unchanged (spaces, quotes, %, backslash).
ENV_NOTE = 'two words "quoted" 100% C:\\dir'
SANDBOX_PROBE = "/srv/edge-node-sandbox-probe"  # a directory the service user owns, outside ReadWritePaths
AS_SERVICE_USER = "setpriv --reuid=edge-node --regid=edge-node --clear-groups"
RESTART_TIMEOUT_S = 180
SQUATTER = "en-squatter"  # a system account that takes the removed edge-node account's UID and GID
# What running a playbook that changes nothing leaves (a bad inventory stops before any task on a host).
SESSION_TRACES = ("var/log/", "var/lib/systemd/", "tmp/", "var/tmp/", "root/.ansible/")


def test_playbook_syntax_check() -> None:
    cmd = [ansible_tool("ansible-playbook"), "--syntax-check", "-i", "deploy/inventory.example.ini", "deploy/site.yml"]
    result = subprocess.run(cmd, cwd=REPO_ROOT, env=ansible_env(), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ansible_lint_production_profile() -> None:
    paths = ["deploy/site.yml", "ansible/", "tests/deploy/render.yml", "tests/deploy/controller.yml"]
    cmd = [ansible_tool("ansible-lint"), "--offline", "--profile", "production", *paths]
    result = subprocess.run(cmd, cwd=REPO_ROOT, env=ansible_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    assert "Profile 'production' was required, and it passed" in result.stdout + result.stderr


def _assert_not_installed(fleet: deploy_hosts.Fleet, host: deploy_hosts.Host) -> None:
    checks = " ; ".join(f"test -e {p} && echo present: {p}" for p in UNTOUCHED_PATHS)
    result = fleet.ssh(host, f"getent passwd edge-node; getent group edge-node; {checks}; true")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"{host.name} has edge-node pieces: {result.stdout}"


BAD_INVENTORIES = {
    "unknown-model": (["edge_node_model=transformer"], 'node2: edge_node_model="transformer" is not one of'),
    "capacity-zero": (["edge_node_capacity=0"], "node2: edge_node_capacity=0 must be auto or a density in (0, 1]"),
    "capacity-above-one": (["edge_node_capacity=1.5"], "node2: edge_node_capacity=1.5 must be auto"),
    "capacity-word": (["edge_node_capacity=fast"], 'node2: edge_node_capacity="fast" must be auto'),
    "no-fleet-id": (["edge_node_fleet=''"], 'node2: edge_node_fleet="" must be a fleet id'),
    "tls-cert-without-key": (
        ["edge_node_tls=True", "edge_node_tls_cert_file=/etc/ssl/node.pem"],
        "node2: TLS is half-configured",
    ),
    "tls-files-without-tls": (
        ["edge_node_tls_ca_file=/a/ca.pem", "edge_node_tls_cert_file=/a/n.pem", "edge_node_tls_key_file=/a/n.key"],
        "node2: TLS is half-configured",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INVENTORIES))
def test_bad_inventory_value_stops_before_any_host_changes(
    case: str, fleet: deploy_hosts.Fleet, tmp_path: Path
) -> None:
    """One bad value on node2 stops the whole play before a task changes node1 or node2."""
    bad_vars, message = BAD_INVENTORIES[case]
    node2_vars = dict(item.split("=", 1) for item in bad_vars)
    inventory = write_inventory(fleet, tmp_path / "inventory.ini", node2=node2_vars)
    before = {host.name: host.snapshot() for host in fleet.hosts}

    run = run_playbook(inventory, log="bad")

    assert run.returncode != 0, run.output[-3000:]
    assert message in run.output, run.output[-3000:]
    assert DEPLOY_PLAY not in run.output, "the deploy play started despite a bad value"
    for host in fleet.hosts:
        changes = host.changes_since(before[host.name], ignored=SESSION_TRACES)
        assert not changes, f"{host.name} changed: {case}: {changes}"
        _assert_not_installed(fleet, host)


def _status(fleet: deploy_hosts.Fleet, host: deploy_hosts.Host) -> dict:
    result = fleet.ssh(host, f"/opt/edge-node/venv/bin/edge-node status --state-dir {STATE_DIR} --json")
    assert result.returncode == 0, f"{host.name}: status exit {result.returncode}: {result.stdout}{result.stderr}"
    return json.loads(result.stdout)


def _rounds(fleet: deploy_hosts.Fleet, host: deploy_hosts.Host) -> list[dict]:
    result = fleet.ssh(host, f"cat {STATE_DIR}/rounds.jsonl 2>/dev/null; true")
    return [json.loads(line) for line in result.stdout.splitlines() if line.strip()]


def _answered(record: dict) -> list[str]:
    """The peers whose models a round received (``peers_answered``: their ids)."""
    answered = record.get("peers_answered") or []
    return list(answered) if isinstance(answered, list) else []


def _main_pid(fleet: deploy_hosts.Fleet, host: deploy_hosts.Host) -> str:
    return fleet.ssh(host, "systemctl show -p MainPID --value edge-node.service").stdout.strip()


def _assert_environment(fleet: deploy_hosts.Fleet, host: deploy_hosts.Host) -> None:
    """The daemon's own environment holds edge_node_environment's value exactly as written."""
    environ = fleet.ssh(host, f"cat /proc/{_main_pid(fleet, host)}/environ").stdout
    assert f"EDGE_NODE_TEST_NOTE={ENV_NOTE}" in environ.split("\0"), f"{host.name}: {environ!r}"


def _assert_sandbox(fleet: deploy_hosts.Fleet, host: deploy_hosts.Host) -> None:
    """In the running unit's mount namespace the service user writes its state directory and nothing else.

    A directory the service user owns outside ReadWritePaths is writable to it from an ordinary
    session (so permissions do not explain a refusal) and read-only inside the daemon's namespace
    (entered with nsenter: the file system view of ProtectSystem=strict, not its seccomp or capabilities).
    """
    pid = _main_pid(fleet, host)
    in_unit = f"nsenter --target {pid} --mount {AS_SERVICE_USER}"
    setup = fleet.ssh(host, f"mkdir {SANDBOX_PROBE} && chown edge-node:edge-node {SANDBOX_PROBE}")
    assert setup.returncode == 0, setup.stderr
    try:
        outside = fleet.ssh(host, f"{AS_SERVICE_USER} touch {SANDBOX_PROBE}/from-a-session")
        inside = fleet.ssh(host, f"{in_unit} touch {SANDBOX_PROBE}/from-the-unit")
        state = fleet.ssh(host, f"{in_unit} touch {STATE_DIR}/sandbox-probe")
    finally:
        fleet.ssh(host, f"rm -rf {SANDBOX_PROBE} {STATE_DIR}/sandbox-probe")
    assert outside.returncode == 0, f"{host.name}: the service user cannot write its own directory: {outside.stderr}"
    assert inside.returncode != 0 and "Read-only file system" in inside.stderr, (
        f"{host.name}: the unit wrote outside ReadWritePaths: rc {inside.returncode} {inside.stderr}"
    )
    assert state.returncode == 0, f"{host.name}: the unit cannot write its state directory: {state.stderr}"


def _wait_for_restart(fleet: deploy_hosts.Fleet, host: deploy_hosts.Host, old_pid: str) -> str:
    """The new main PID once systemd has started the unit again and it is active (ready) again."""
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    while time.monotonic() < deadline:
        show = fleet.ssh(host, "systemctl show edge-node.service -p MainPID -p ActiveState -p SubState").stdout
        props = dict(line.split("=", 1) for line in show.split())
        if props.get("ActiveState") == "active" and props.get("MainPID") not in ("0", old_pid, None):
            return props["MainPID"]
        time.sleep(1)
    journal = fleet.ssh(host, "journalctl -u edge-node --no-pager -n 40").stdout
    pytest.fail(f"{host.name}: not restarted within {RESTART_TIMEOUT_S} s of kill -9:\n{journal}")


@dataclass
class Converged:
    """The first converge of the module's fleet, and each host's state just before it."""

    inventory: Path
    first: PlaybookRun
    before: dict[str, dict[str, str | None]]  # host name -> Host.snapshot() before the converge
    finished: float  # time.monotonic() at its end


@pytest.fixture(scope="module")
def converged(fleet: deploy_hosts.Fleet, tmp_path_factory: pytest.TempPathFactory) -> Converged:
    """One converge shared by the tests that need a deployed fleet (each may also run alone, with -k)."""
    tmp = tmp_path_factory.mktemp("converge")
    settings = {
        "edge_node_tls": True,  # a fleet CA made on the controller, a certificate per host
        "edge_node_tls_ca_dir": str(tmp / "fleet-ca"),
        "edge_node_health_retries": 60,
        # A user's own package, as a team deploys it (issue: "their own model and data"): the example's source
        # folder on the controller, built into a wheel and shipped in the offline wheelhouse with its own
        # dependencies (scikit-learn); the daemons train its model (entry point) on its data factory.
        "edge_node_plugin_packages": [str(REPO_ROOT / "examples" / "digits_tabular")],
        "edge_node_model": PLUGIN_MODEL,
        "edge_node_dataset": PLUGIN_DATASET,
        # A quarter of the digits per node and one epoch: rounds of seconds, not minutes.
        "edge_node_num_clients": 4,
        # The rollout is serial (25% of 2 hosts: one at a time): node1 trains alone while node2 installs
        # and is many rounds ahead when node2 starts; node2 continues at node1's round once it has pulled
        # it (the daemon's catch-up), so the default staleness bound must not make node1 refuse node2 for ever.
        "edge_node_extra_config": {"epochs": 1},
        # A value with what systemd's Environment= would otherwise split, unescape or expand.
        "edge_node_environment": {"EDGE_NODE_TEST_NOTE": ENV_NOTE},
    }
    inventory = write_inventory(
        fleet,
        tmp / "inventory.ini",
        extra_vars=settings,
        # Fixed tiers (no start-up probe): node1 trains a sparse model, node2 a dense one.
        node1={"edge_node_client_index": 0, "edge_node_capacity": 0.8},
        node2={"edge_node_client_index": 1, "edge_node_capacity": 1.0},
    )
    before = {host.name: host.snapshot() for host in fleet.hosts}
    first = run_playbook(inventory, log="converge1")
    TIMINGS["converge 1 (install, configure, start, healthy)"] = first.seconds
    if first.returncode != 0:
        pytest.fail(f"converge 1 failed ({first.returncode}):\n{first.output[-8000:]}")
    return Converged(inventory, first, before, time.monotonic())


@pytest.mark.timeout(2400)  # converge 1 is this test's setup
def test_converge_starts_a_fleet_that_trades_models_and_second_run_changes_nothing(
    fleet: deploy_hosts.Fleet, converged: Converged
) -> None:
    first = converged.first
    print(f"\nconverge 1: {first.seconds:.1f} s, recap {first.recap()}")
    assert set(first.recap()) == {"node1", "node2"}
    assert first.output.count(DEPLOY_PLAY) == 2, "25% of 2 hosts: the rollout should take them one at a time"

    for host in fleet.hosts:
        unit = fleet.ssh(
            host,
            "systemctl show edge-node.service -p ActiveState -p Type -p Restart -p User "
            "-p WatchdogUSec -p NoNewPrivileges -p ProtectSystem -p PrivateTmp -p UnitFileState",
        )
        props = dict(line.split("=", 1) for line in unit.stdout.split())
        assert props == props | {
            "ActiveState": "active", "Type": "notify", "Restart": "on-failure", "User": "edge-node",
            "NoNewPrivileges": "yes", "ProtectSystem": "strict", "PrivateTmp": "yes", "UnitFileState": "enabled",
        }, f"{host.name}: {props}"  # fmt: skip
        assert props["WatchdogUSec"] not in ("0", "infinity"), props
        account = fleet.ssh(host, "getent passwd edge-node").stdout.strip().split(":")
        assert account[-1] in ("/usr/sbin/nologin", "/sbin/nologin"), account
        key = fleet.ssh(host, "stat -c '%U %a' /etc/edge-node/tls/node.key").stdout.strip()
        assert key == "edge-node 600", f"{host.name}: node.key is {key}"
        config = fleet.ssh(host, "cat /etc/edge-node/config.toml").stdout
        assert 'fleet = "deploy-test"' in config and f'node_id = "{host.name}"' in config, config
        assert _status(fleet, host)["healthy"] is True
        _assert_environment(fleet, host)
        _assert_sandbox(fleet, host)
        routes = fleet.ssh(host, "ip route show default").stdout.strip()
        assert routes == "", f"{host.name} has a default route ({routes}): the wheelhouse test would prove nothing"
        apt = fleet.ssh(host, "python3 -c 'import apt' 2>&1; dpkg-query -W python3-apt 2>&1").stdout
        assert "No module named 'apt'" in apt, f"{host.name} has python3-apt: the offline apt path is not tested"

    # The daemons found each other over mDNS and trade models: each logs rounds with the other's model.
    deadline = time.monotonic() + ROUNDS_TIMEOUT_S
    traded: dict[str, dict] = {}
    while len(traded) < len(fleet.hosts) and time.monotonic() < deadline:
        for host in fleet.hosts:
            others = {h.name for h in fleet.hosts} - {host.name}
            with_peer = [r for r in _rounds(fleet, host) if others & set(_answered(r)) and r.get("bytes_in", 0) > 0]
            if with_peer and host.name not in traded:
                traded[host.name] = with_peer[0]
                TIMINGS[f"{host.name}: a round with the other's model, after converge 1"] = (
                    time.monotonic() - converged.finished
                )
        time.sleep(2)
    for host in fleet.hosts:
        print(f"{host.name} rounds.jsonl: {[json.dumps(r)[:300] for r in _rounds(fleet, host)]}")
        if host.name not in traded:
            journal = fleet.ssh(host, "journalctl -u edge-node --no-pager -n 60").stdout
            pytest.fail(f"{host.name}: no round with a model from its peer in {ROUNDS_TIMEOUT_S} s:\n{journal}")

    # The user's model, not a built-in one: the architecture id names the plug-in (status) on both hosts.
    for host in fleet.hosts:
        model = _status(fleet, host)["model"]
        assert model.startswith(f"{PLUGIN_MODEL}/10/"), f"{host.name} trains {model}, not the plug-in's model"
        config = fleet.ssh(host, "cat /etc/edge-node/config.toml").stdout
        assert f'model = "{PLUGIN_MODEL}"' in config and f'dataset = "{PLUGIN_DATASET}"' in config, config

    tiers = {host.name: {r.get("tier") for r in _rounds(fleet, host)} for host in fleet.hosts}
    assert tiers == {"node1": {"0.8"}, "node2": {"1.0"}}, f"capacities not as in the inventory: {tiers}"

    # The second run takes both hosts in one batch: the first showed the rollout in batches, and
    # whether a run changes something does not depend on them (one batch halves the run's overhead).
    pids = {host.name: _main_pid(fleet, host) for host in fleet.hosts}
    second = run_playbook(converged.inventory, "-e", "edge_node_serial=100%", log="converge2")
    TIMINGS["converge 2 (nothing to change)"] = second.seconds
    print(f"converge 2: {second.seconds:.1f} s, recap {second.recap()}")
    assert second.returncode == 0, second.output[-8000:]
    assert set(second.recap()) == {"node1", "node2"}
    for name, counters in second.recap().items():
        assert counters["changed"] == 0 and counters["failed"] == 0, f"{name}: {counters}\n{second.output[-8000:]}"
    assert {host.name: _main_pid(fleet, host) for host in fleet.hosts} == pids, "the second run restarted a daemon"

    # Restart=on-failure at work: a daemon killed with SIGKILL is started again by systemd.
    node = fleet.hosts[0]
    restarts = fleet.ssh(node, "systemctl show -p NRestarts --value edge-node.service").stdout.strip()
    killed_at = time.monotonic()
    assert fleet.ssh(node, f"kill -9 {pids[node.name]}").returncode == 0
    new_pid = _wait_for_restart(fleet, node, pids[node.name])
    TIMINGS[f"{node.name}: kill -9 until active again (RestartSec 10 s)"] = time.monotonic() - killed_at
    after = fleet.ssh(node, "systemctl show -p NRestarts --value edge-node.service").stdout.strip()
    assert int(after) == int(restarts) + 1, f"NRestarts {restarts} -> {after}"
    assert new_pid != pids[node.name] and _status(fleet, node)["healthy"] is True


def _reinstall_over_kept_state(
    fleet: deploy_hosts.Fleet, node: deploy_hosts.Host, inventory: Path, old_ids: list[str]
) -> None:
    """A deployment onto a host whose kept state belongs to the removed account's UID, now someone else's.

    Another system account takes the old UID and GID (as a package installed meanwhile might), so
    the account made again gets other ones; the daemon must still resume and log rounds.
    """
    rounds_before = max(r["round"] for r in _rounds(fleet, node))
    squat = fleet.ssh(
        node,
        f"groupadd --system --gid {old_ids[1]} {SQUATTER} && useradd --system --uid {old_ids[0]} --gid {SQUATTER}"
        f" --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin {SQUATTER}",
    )
    assert squat.returncode == 0, squat.stderr
    assert fleet.ssh(node, f"stat -c %U {STATE_DIR}/rounds.jsonl").stdout.strip() == SQUATTER

    again = run_playbook(inventory, "--limit", node.name, "-e", "edge_node_serial=100%", log="reinstall")
    TIMINGS[f"{node.name}: converge after uninstall, the kept state on another UID"] = again.seconds
    assert again.returncode == 0, again.output[-8000:]
    new_ids = fleet.ssh(node, "id -u edge-node; id -g edge-node").stdout.split()
    assert new_ids[0] != old_ids[0], f"the account got its old UID {old_ids[0]} back: the test proves nothing"
    owners = fleet.ssh(node, f"find {STATE_DIR} ! -user edge-node -printf '%p %u\\n'").stdout
    assert owners == "", f"state not given to the new account:\n{owners}"
    deadline = time.monotonic() + ROUNDS_TIMEOUT_S
    while time.monotonic() < deadline:
        if max(r["round"] for r in _rounds(fleet, node)) > rounds_before:
            break
        time.sleep(2)
    else:
        journal = fleet.ssh(node, "journalctl -u edge-node --no-pager -n 40").stdout
        pytest.fail(f"{node.name}: no round after round {rounds_before} in {ROUNDS_TIMEOUT_S} s:\n{journal}")
    assert _status(fleet, node)["healthy"] is True


@pytest.mark.timeout(3000)  # run alone (-k), converge 1 is its setup too
def test_stop_then_uninstall_leaves_the_host_clean(fleet: deploy_hosts.Fleet, converged: Converged) -> None:
    """stop stops the daemons; uninstall removes all but the state (a new deployment resumes from it on a new
    UID); purging leaves the host as before."""
    inventory = converged.inventory
    for host in fleet.hosts:
        assert fleet.ssh(host, "systemctl is-active edge-node").stdout.strip() == "active", "no converged host"

    stop = run_playbook(inventory, "--tags", "stop", log="stop")
    TIMINGS["--tags stop"] = stop.seconds
    assert stop.returncode == 0, stop.output[-5000:]
    assert stop.output.count(DEPLOY_PLAY) == 1, "stopping has nothing to roll: every host at once"
    for host in fleet.hosts:
        assert fleet.ssh(host, "systemctl is-active edge-node").stdout.strip() == "inactive"
        assert fleet.ssh(host, "systemctl is-enabled edge-node").stdout.strip() == "disabled"

    node = fleet.hosts[0]
    old_ids = fleet.ssh(node, "id -u edge-node; id -g edge-node").stdout.split()
    uninstall = run_playbook(inventory, "--tags", "uninstall", log="uninstall")
    TIMINGS["--tags uninstall"] = uninstall.seconds
    assert uninstall.returncode == 0, uninstall.output[-5000:]
    for host in fleet.hosts:
        left = fleet.ssh(host, f"ls -d {' '.join(UNTOUCHED_PATHS)} 2>/dev/null; getent passwd edge-node; true")
        assert left.stdout.split() == [STATE_DIR], f"{host.name} after uninstall: {left.stdout}"
        assert fleet.ssh(host, "systemctl cat edge-node.service").returncode != 0
        assert fleet.ssh(host, f"test -s {STATE_DIR}/rounds.jsonl").returncode == 0, "uninstall lost the round log"

    _reinstall_over_kept_state(fleet, node, inventory, old_ids)

    purge = run_playbook(inventory, "--tags", "uninstall", "-e", "edge_node_purge_state=true", log="purge")
    TIMINGS["--tags uninstall -e edge_node_purge_state=true"] = purge.seconds
    assert purge.returncode == 0, purge.output[-5000:]
    squatter = fleet.ssh(node, f"userdel {SQUATTER}; groupdel {SQUATTER} 2>/dev/null; getent passwd {SQUATTER}; true")
    assert squatter.stdout.strip() == "", squatter.stdout
    for host in fleet.hosts:
        _assert_not_installed(fleet, host)
        changes = host.changes_since(converged.before[host.name], ignored=tuple(LEFTOVERS))
        assert not changes, f"{host.name} differs from before the converge: " + "".join(
            f"\n  /{path}: {then} -> {now}" for path, (then, now) in changes.items()
        )
