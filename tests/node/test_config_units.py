"""The daemon's config, capacity rule, peer backoff, systemd notify, status socket and checkpoint rules."""

import json
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from edge_node.algorithm.dispfl import start
from edge_node.errors import CheckpointError, ConfigError
from edge_node.models import build_model
from edge_node.net import ServerLimits
from edge_node.node import capacity
from edge_node.node.config import NodeConfig, node_id_from_hostname
from edge_node.node.notify import Watchdog, sd_notify, watchdog_interval_s
from edge_node.node.peers import PeerTracker
from edge_node.node.state import Checkpoint, Identity, StateDirLock, load_checkpoint, save_checkpoint
from edge_node.node.status import StatusServer, query, read_status_file, write_status_file
from edge_node.tomlconf import build, read_toml, to_toml
from edge_node.wire import ModelSpec


def test_node_id_from_hostname_follows_the_one_rule():
    assert node_id_from_hostname("pi-kitchen.local") == "pi-kitchen"
    assert node_id_from_hostname("Jetson_Nano 2") == "Jetson_Nano-2"
    assert node_id_from_hostname("a" * 80) == "a" * 63
    with pytest.raises(ConfigError, match="cannot derive a node id"):
        node_id_from_hostname("---")


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"capacity": "0"}, "capacity='0' must be auto (measure; picks a tier: 0.2, 0.4, 0.6, 0.8, 1) or a density"),
        ({"capacity": "1.5"}, "capacity='1.5' must be auto"),
        ({"capacity": "fast"}, "capacity='fast' must be auto"),
        ({"model": "lenet"}, "model='lenet' must be one of cnn, resnet18, vgg11"),
        ({"discovery": "static"}, "discovery='static' needs peers"),
        ({"tls_ca": "ca.pem"}, "TLS needs all three"),
        ({"num_clients": 4}, "num_clients=4 needs client_index"),
        ({"num_clients": 4, "client_index": 4}, "client_index=4 must be < num_clients=4"),
        ({"lr": -1.0}, "lr=-1.0 must be a positive number"),
        ({"listen": "7878"}, "listen='7878' must be HOST:PORT"),
        ({"lockstep": True}, "lockstep needs client_index"),
        ({"node_id": "bad.id"}, "node_id='bad.id' must match"),
        ({"server_max_connections_per_host": 0}, "server_max_connections_per_host=0 must be a positive integer"),
        ({"server_max_connection_age_s": 0}, "server_max_connection_age_s=0.0 must be a number of seconds"),
        ({"server_host_rate": 0}, "server_host_rate=0.0 must be a number of calls per second in (0, 1e6]"),
        ({"server_host_rate": -5}, "server_host_rate=-5.0 must be a number of calls per second"),
        ({"tier_mode": "depth"}, "tier_mode='depth' must be one of mask, width, both"),
        ({"tier_mode": "width", "capacity": "0.5"}, "tier_mode width: capacity='0.5' must be a tier (0.2, 0.4,"),
        ({"tier_mode": "both", "density": 0}, "density=0.0 must be a number in (0, 1]"),
        ({"tier_mode": "width", "trainable": ["fc3.*"]}, "tier_mode width trains narrow models of every layer"),
        ({"tier_mode": "both", "norm_stats": "average"}, "tier_mode both trains GroupNorm models only"),
    ],
)
def test_bad_values_are_named(values, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build(NodeConfig, {"fleet": "f", **values}, "test")


def test_server_keys_reach_the_servers_limits():
    values = {"fleet": "f", "server_max_connections_per_host": 4, "server_max_connection_age_s": 9,
              "server_host_rate": 7}  # fmt: skip
    config = build(NodeConfig, values, "test")
    limits = config.server_limits()
    assert (limits.max_connections_per_host, limits.max_connection_age_s, limits.host_rate) == (4, 9.0, 7.0)
    defaults = NodeConfig().server_limits()
    assert (defaults.max_connections_per_host, defaults.max_connection_age_s) == (32, 60.0)
    assert defaults.host_rate == ServerLimits().host_rate == 50.0  # one default, the README's


def test_capacity_takes_any_density_as_a_fixed_override():
    """Setting (i) of the paper, every node at 0.5, runs on a fleet: any density in (0, 1]; its tier is the
    largest tier density not above it (what TXT and Hello advertise)."""
    for text, density in (("0.5", 0.5), ("1", 1.0), ("0.05", 0.05), (0.6, 0.6)):
        assert build(NodeConfig, {"fleet": "f", "capacity": text}, "test").fixed_density == density
    assert NodeConfig(capacity="auto").fixed_density is None
    decision = capacity.configured(0.5)
    assert (decision.density, decision.tier, decision.decided_by) == (0.5, "0.4", "--capacity 0.5")


def test_runnable_needs_fleet_and_tls_or_insecure():
    with pytest.raises(ConfigError, match="fleet is required"):
        NodeConfig().check_runnable()
    with pytest.raises(ConfigError, match="no TLS material"):
        NodeConfig(fleet="f").check_runnable()
    NodeConfig(fleet="f", insecure=True).check_runnable()


def test_config_file_round_trips(tmp_path):
    config = build(
        NodeConfig,
        {"fleet": "home", "node_id": "pi-1", "peers": ["b@10.0.0.2:7878"], "capacity": 0.6, "insecure": True},
        "test",
    )
    path = tmp_path / "c.toml"
    path.write_text(to_toml(config))
    again = build(NodeConfig, read_toml(path), str(path))
    assert again == config and again.fixed_density == 0.6


def _measured(samples_per_s=1000.0, link=None, available=8 << 30, activation=50 << 20):
    return capacity.Measurements(
        samples_per_s, 10, 1.0, 128, 0.1, 1.2, activation, available, 4, 4, "none", link, "test"
    )  # fmt: skip


def _spec():
    return ModelSpec.from_tensors("cnn", 10, dict(build_model("cnn").named_parameters()))


def test_capacity_rule_picks_the_densest_tier_that_fits():
    spec = _spec()
    kw = dict(epochs=5, samples=500, neighbours=3, round_budget_s=60.0)
    fast = capacity.choose_tier(_measured(), spec, **kw)
    assert fast.density == 1.0 and "link speed not reported" in fast.decided_by
    # 1 Mbit/s: 3 dense cnn models (3.2 MB each) take ~77 s, so the transfer term decides.
    slow_link = capacity.choose_tier(_measured(link=1.0), spec, **kw)
    assert slow_link.density < 1.0 and "transfer" in slow_link.decided_by
    fits = [c for c in slow_link.checks if c.fits]
    assert slow_link.density == max(c.density for c in fits)
    assert len({c.train_s for c in slow_link.checks}) == 1  # dense kernels: training time is the same at every tier
    too_slow = capacity.choose_tier(_measured(samples_per_s=10.0), spec, **kw)
    assert too_slow.density == 0.2 and too_slow.decided_by.startswith("no tier fits")
    no_memory = capacity.choose_tier(_measured(available=1 << 20), spec, **kw)
    assert no_memory.density == 0.2 and "memory" in no_memory.decided_by


def test_link_speed_reads_sysfs(tmp_path):
    for name, speed in (("eth0", "1000"), ("wlan0", "-1"), ("eth1", "100")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "speed").write_text(speed + "\n")
    assert capacity.link_speed([], tmp_path) == (100.0, f"eth1: 100 Mbit/s ({tmp_path}/eth1/speed)")
    assert capacity.link_speed(["wlan0"], tmp_path)[0] is None


def test_peer_backoff_grows_with_jitter_and_clears():
    tracker = PeerTracker(np.random.default_rng(0), base_backoff_s=2, max_backoff_s=10)
    waits = [tracker.failure("a", "unreachable", "down", now=100.0) for _ in range(5)]
    assert 1.0 <= waits[0] < 3.0 and all(w <= 15.0 for w in waits) and waits[3] > waits[0]
    assert tracker.eligible(["a", "b"], now=100.0) == ["b"]
    tracker.success("a", 3, now=200.0)
    assert tracker.eligible(["a", "b"], now=200.0) == ["a", "b"]
    assert tracker.to_json(now=200.0)[0]["last_result"] == "ok"
    tracker.forget_except({"b"})
    assert tracker.records() == []


def test_a_peer_is_model_refused_only_while_its_last_pull_refused_its_model():
    tracker = PeerTracker(np.random.default_rng(0))
    for kind in ("unreachable", "timeout", "not-ready", "stale", "refused"):  # the link, its pace, busy
        tracker.failure("slow", kind, "")
        assert not tracker.model_refused("slow"), kind
    for kind in ("decode", "limit", "header", "identity", "tls", "screened"):
        tracker.failure("bad", kind, "")
        assert tracker.model_refused("bad"), kind
    tracker.success("bad", 2)
    assert not tracker.model_refused("bad") and not tracker.model_refused("never-pulled")


def test_sd_notify_and_watchdog(tmp_path):
    path = tmp_path / "notify.sock"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(str(path))
    listener.settimeout(5)
    try:
        assert not sd_notify("READY=1", env={})
        assert sd_notify("READY=1", env={"NOTIFY_SOCKET": str(path)})
        assert listener.recv(100) == b"READY=1"
        assert watchdog_interval_s({"WATCHDOG_USEC": "2000000"}) == 1.0
        assert watchdog_interval_s({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "1"}) is None
        beat = [time.monotonic()]
        monkey_env = {"NOTIFY_SOCKET": str(path)}
        import os

        old = os.environ.get("NOTIFY_SOCKET")
        os.environ.update(monkey_env)
        dog = Watchdog(0.05, lambda: beat[0], max_age_s=0.3)
        dog.start()
        try:
            assert listener.recv(100) == b"WATCHDOG=1"
            beat[0] = time.monotonic() - 10  # a hung main loop: the pings stop
            time.sleep(0.2)
            listener.settimeout(0.01)
            while True:
                try:
                    listener.recv(100)
                except TimeoutError:
                    break
            listener.settimeout(0.3)
            with pytest.raises(TimeoutError):
                listener.recv(100)
        finally:
            dog.stop()
            if old is None:
                os.environ.pop("NOTIFY_SOCKET", None)
            else:
                os.environ["NOTIFY_SOCKET"] = old
    finally:
        listener.close()


def test_status_socket_live_then_file(tmp_path):
    server = StatusServer(tmp_path, lambda: {"node_id": "n", "healthy": True, "source": "live"})
    server.start()
    try:
        assert query(tmp_path) == {"node_id": "n", "healthy": True, "source": "live"}
        assert oct((tmp_path / "status.sock").stat().st_mode & 0o777) == "0o600"
    finally:
        server.stop()
    assert query(tmp_path, timeout_s=0.5) is None
    write_status_file(tmp_path, {"node_id": "n", "healthy": True, "source": "live"})
    old = read_status_file(tmp_path)
    assert old["source"] == "file" and old["healthy"] is False and old["file_age_s"] >= 0


def test_checkpoint_refuses_foreign_and_corrupt(tmp_path):
    init = dict(build_model("cnn", seed=0).named_parameters())
    init = {k: v.detach() for k, v in init.items()}
    state = start(init, 0.4, seed=0, client=2)
    me = Identity("a", "f", "cnn/10/x", 0, 2)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, Checkpoint(me, 3, state))
    back = load_checkpoint(path, me, torch.device("cpu"))
    assert back.rounds_done == 3 and back.state.density == 0.4
    assert all(torch.equal(back.state.weights[k], state.weights[k]) for k in init)
    with pytest.raises(CheckpointError, match=r"belongs to another node or setting: fleet 'f' \(this node: 'g'\)"):
        load_checkpoint(path, Identity("a", "g", "cnn/10/x", 0, 2), torch.device("cpu"))
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="cannot read node checkpoint"):
        load_checkpoint(path, me, torch.device("cpu"))
    assert load_checkpoint(tmp_path / "absent.pt", me, torch.device("cpu")) is None


def test_state_dir_lock_is_exclusive(tmp_path):
    first = StateDirLock(tmp_path / "s")
    first.acquire()
    try:
        with pytest.raises(ConfigError, match="another edge-node .* is running with state dir"):
            StateDirLock(tmp_path / "s").acquire()
    finally:
        first.release()
    again = StateDirLock(tmp_path / "s")
    again.acquire()
    again.release()


def test_status_json_is_valid(tmp_path):
    write_status_file(Path(tmp_path), {"a": 1})
    assert json.loads((tmp_path / "status.json").read_text()) == {"a": 1}


def test_catch_up_follows_the_median_of_the_rounds_models_never_one_liar():
    from edge_node.node.daemon import catch_up

    assert catch_up(0, [], lockstep=False) == 1
    assert catch_up(0, [50], lockstep=False) == 50  # a late joiner whose only peer is ahead takes its round
    assert catch_up(0, [50, 48], lockstep=False) == 48  # all its peers ahead: the upper median of 1, 48, 50
    assert catch_up(0, [12, 3], lockstep=False) == 3  # models at 1 (own), 3, 12: the upper median, 3
    assert catch_up(20, [12, 19], lockstep=False) == 21  # peers behind never pull it back
    assert catch_up(0, [12], lockstep=True) == 1  # lockstep runs every round


def test_one_peer_claiming_a_huge_round_moves_nothing_next_to_honest_ones():
    from edge_node.node.daemon import catch_up

    liar = 10**15
    assert catch_up(4, [5, liar], lockstep=False) == 5  # {5, 5, liar}: the honest majority wins
    assert catch_up(4, [5, 5, liar], lockstep=False) == 5
    assert catch_up(4, [5, liar, liar], lockstep=False) == liar  # half the models agree: followed
    assert catch_up(4, [liar], lockstep=False) == liar  # a lone peer answering still can (documented)


def test_status_text_shows_how_the_tier_was_decided_and_what_was_refused():
    from edge_node.cli.status import format_status

    status = {
        "source": "live", "healthy": True, "pid": 1, "node_id": "pi", "fleet": "f", "port": 7878, "model": "cnn",
        "tier": "0.4", "density": 0.4, "round": 3, "phase": "idle", "peers": [], "bytes_in_total": 0,
        "capacity": capacity.kept_from_checkpoint(0.4, None).to_json(),
        "server_refusals": {"busy": 1}, "discovery_refusals": {"other_fleet": 2, "bad_address": 1},
    }  # fmt: skip
    lines = format_status(status).splitlines()
    assert "capacity     checkpoint: kept from the checkpoint: not probed at start" in "\n".join(lines)
    assert "refused      server busy 1; discovery bad_address 1, other_fleet 2" in lines


class _Slow(torch.nn.Module):
    """The demo cnn at 0.05 s per sample and forward pass: a 128-sample step takes over 6.4 s."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = build_model("cnn", 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        time.sleep(0.05 * x.shape[0])
        return self.inner(x)


def test_the_probe_of_a_slow_device_stays_within_its_window(tmp_path):
    """A full batch would take 6.4 s a step (12.8 s for a full-batch warm-up and one step); with a 1 s
    window the probe cuts the batch and ends after the warm-up and about the window."""
    from edge_node.node.local_data import load_local_data

    config = NodeConfig(fleet="f", num_clients=6, client_index=0, state_dir=tmp_path)
    local = load_local_data(config, 0, torch.device("cpu"))
    stops = []
    m = capacity.probe(_Slow(), local.data, 128, probe_s=1.0, check_stop=lambda: stops.append(1))
    assert m.probe_batch_size < 128 and m.probe_steps >= 1, m
    assert m.probe_total_s < 10.0, m  # warm-up of 2 x 8 samples (0.8 s of sleep) + about the 1 s window
    assert len(stops) == 2 + m.probe_steps  # a stop is checked before every step
