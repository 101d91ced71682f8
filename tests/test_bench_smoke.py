"""Tiny runs of the benchmarks so they keep working (figures are printed, never asserted as timings)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


def test_wire_bench_quick_prints_sizes_and_the_loopback_ratio(tmp_path: Path):
    out = tmp_path / "wire.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "wire.py"), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "loopback pulls" in proc.stdout and "cnn       float16" in proc.stdout and "x)" in proc.stdout
    assert json.loads(out.read_text())


def test_sim_memory_bench_measures_both_layouts(tmp_path: Path):
    out = tmp_path / "mem.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "sim_memory.py"), "--clients", "3", "--model", "cnn", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())
    assert figures["ours_peak_rss_gib"] > 0 and figures["naive_peak_rss_gib"] > 0


def test_hostile_bench_quick_measures_every_attack(tmp_path: Path):
    out = tmp_path / "hostile.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "hostile.py"), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = {row["attack"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["honest"]["outcome"] == "accepted" and rows["3e38 values"]["outcome"] == "screen: refused"
    assert all(row["outcome"] != "accepted" for name, row in rows.items() if name not in ("honest", "never-ending"))
    assert "slow-loris" in proc.stdout and "peak RSS" in proc.stdout


def test_hostile_mdns_bench_says_it_needs_root():
    """Without root it stops at once with a clear message and exit 2 (it never falls back to real interfaces)."""
    import os
    import shutil

    import pytest

    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is missing: cannot drop root to check the message")
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    proc = subprocess.run(
        [*drop, sys.executable, str(BENCH / "hostile_mdns.py"), "--quick"],
        capture_output=True, text=True, timeout=60, cwd="/",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "needs root" in proc.stderr and "network namespaces" in proc.stderr


def test_hostile_mdns_bench_quick_burst_prints_the_victims_costs(tmp_path: Path, require_root: None):
    out = tmp_path / "hostile_mdns.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "hostile_mdns.py"), "--quick", "--only", "burst", "--window", "2",
         "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "burst" in proc.stdout and "reals kept" in proc.stdout
    [row] = json.loads(out.read_text())["rows"]
    assert row["scenario"] == "burst" and row["packets_sent_by_attacker"] > 0 and "cpu_s" in row


def test_soak_bench_samples_every_daemon(tmp_path: Path):
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "soak.py"), "--nodes", "2", "--minutes", "0.25", "--sample-s", "2", "--json",
         str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "worst RSS slope" in proc.stdout
    result = json.loads(out.read_text())
    assert [n["node"] for n in result["per_node"]] == ["node0", "node1"]
    # each daemon was sampled while alive (torch loaded: tens of MB) and holds a few descriptors
    assert all(n["rss_mb_max"] > 50 and n["fds_max"] > 3 for n in result["per_node"]), result["per_node"]
    assert set(result["exit_codes"].values()) == {0}  # stopped cleanly by SIGTERM


def test_capacity_bench_probes_as_the_daemon_does(tmp_path: Path):
    out = tmp_path / "capacity.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "capacity.py"), "--models", "cnn", "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out.read_text())["rows"]
    m = row["decision"]["measurements"]
    assert m["train_samples_per_s"] > 0 and m["torch_threads"] == 1 and row["decision"]["tier"]
    assert "probe " in proc.stdout and "tier " in proc.stdout and "window" in proc.stdout


def test_node_memory_bench_samples_daemons_through_their_rounds(tmp_path: Path):
    out = tmp_path / "memory.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "node_memory.py"), "--models", "cnn", "--rounds", "1", "--batch-size", "32",
         "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (result,) = json.loads(out.read_text())["results"]
    assert set(result["exit_codes"].values()) == {0}, result["exit_codes"]
    # each daemon was sampled serving and through its round: torch loaded, so tens of MB at least
    for node in result["per_node"]:
        assert node["rounds"] == 1 and node["startup_rss_mb"] > 50 and node["max_rss_mb"] >= node["median_rss_mb"]
    assert "cnn" in proc.stdout and "RSS MB start-up" in proc.stdout


def test_micro_batch_bench_times_each_slice_size_in_its_own_process(tmp_path: Path):
    out = tmp_path / "micro.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "micro_batch.py"), "--steps", "1", "--repeats", "1", "--micro", "0", "16",
         "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "whole" in proc.stdout and "x RSS" in proc.stdout
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"0", "16"} and all(r["s_per_step"] > 0 and r["peak_rss_mb"] > 100 for r in rows.values())


def test_pool_step_bench_times_both_orders_and_checks_their_bits(tmp_path: Path):
    out = tmp_path / "pool.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "pool_step.py"), "--batch-sizes", "4", "--repeats", "1", "--images", "8",
         "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "equal" in proc.stdout and "DIFFERENT" not in proc.stdout
    (row,) = json.loads(out.read_text())["results"]
    assert row["bitwise_equal"] and all(t > 0 for t in [*row["train_s"].values(), *row["eval_s"].values()])


def test_screen_margin_bisection_finds_a_peers_ratio_to_the_reference():
    """A peer 4x the size of the two others (own included: the median is theirs) passes from 4x on."""
    import torch

    sys.path.insert(0, str(BENCH.parent))
    from bench.screen_margin import smallest_passing_ratio

    g = torch.Generator().manual_seed(0)
    weights = {"a": torch.randn(50, generator=g), "b": torch.randn(8, generator=g)}
    masks = {name: torch.ones_like(w, dtype=torch.bool) for name, w in weights.items()}
    peers = [("same", weights, masks), ("big", {k: 4 * v for k, v in weights.items()}, masks)]
    for kind in ("rms", "amax"):
        assert 4.0 <= smallest_passing_ratio((weights, masks), peers, kind) <= 4.0 * 1.006
    assert smallest_passing_ratio((weights, masks), peers[:1], "rms") == 1.0


def test_screen_margin_bench_tiny_run(tmp_path: Path):
    out = tmp_path / "margin.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "screen_margin.py"), "--clients", "3", "--rounds", "1", "--epochs", "1",
         "--batch-size", "32", "--samples-per-client", "64", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out.read_text())["rounds"]
    assert 1.0 <= row["rms_margin"] < 10 and 1.0 <= row["amax_margin"] < 10 and row["spread"] >= 1.0
    assert "largest honest margin over 1 rounds" in proc.stdout


@pytest.mark.slow
@pytest.mark.netns
def test_hetero_fleet_bench_runs_an_arm_and_the_slowest_tier_after_it(tmp_path: Path, require_root: None):
    from edge_node.fleet.cgroups import system_hierarchy

    if system_hierarchy() is None:
        pytest.skip("no cgroup hierarchy with the cpu and memory controllers")
    out = tmp_path / "hetero"
    fleet = [sys.executable, str(BENCH / "hetero_fleet.py"), "--output", str(out), "--demo", "--nodes", "2",
             "--rounds", "1", "--devices", "name=a,cpu=0.5,mem=1g;name=b,cpu=0.25,mem=1g",
             "--pull-timeout-s", "15"]  # fmt: skip
    # One arm per command, as in separate quiet windows: the second finds the first's tiers in hetero.json.
    for arm in ("auto", "slowest"):
        proc = subprocess.run([*fleet, "--arms", arm], capture_output=True, text=True, timeout=400)
        assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads((out / "hetero.json").read_text())["arms"]
    assert set(result) == {"auto", "slowest"} and all(a["exit_code"] == 0 for a in result.values())
    slowest = min(result["auto"]["tiers"].values(), key=float)
    assert set(result["slowest"]["tiers"].values()) == {slowest}  # every node at the auto arm's slowest tier
    assert (out / "hetero.md").read_text().count("| auto | 0 |") == 1 and (out / "hetero.png").exists()
    # Another fleet's arms are not mixed into these: one line, exit 2, the file unchanged.
    before = (out / "hetero.json").read_text()
    other = subprocess.run([*fleet[:-2], "--pull-timeout-s", "16", "--arms", "dense"], capture_output=True,
                           text=True, timeout=60)  # fmt: skip
    assert other.returncode == 2 and "holds arms of other settings" in other.stderr
    assert (out / "hetero.json").read_text() == before
    # --reanalyse runs nothing and recomputes each arm from its nodes' records: the same timeline, also for
    # an arm saved without its start time (found again from its first timeline point).
    saved = json.loads(before)
    del saved["arms"]["slowest"]["started_unix"]
    (out / "hetero.json").write_text(json.dumps(saved))
    again = subprocess.run([*fleet, "--target", "0.25", "--reanalyse"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr[-2000:]
    redone = json.loads((out / "hetero.json").read_text())
    assert redone["settings"]["target"] == 0.25 and "target mean accuracy 25%" in (out / "hetero.md").read_text()
    for arm, old in json.loads(before)["arms"].items():
        new = redone["arms"][arm]
        assert new["wall_s"] == old["wall_s"] and new["tiers"] == old["tiers"]
        assert new["started_unix"] == pytest.approx(old["started_unix"], abs=1e-3)
        assert [p["bytes_in"] for p in new["timeline"]] == [p["bytes_in"] for p in old["timeline"]]
        assert [p["wall_s"] for p in new["timeline"]] == pytest.approx([p["wall_s"] for p in old["timeline"]])


def test_reference_round_bench_tiny_run(tmp_path: Path):
    out = tmp_path / "ref.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "reference_round.py"), "--dataset", "demo", "--clients", "3", "--neighbours",
         "1", "--samples-per-client", "40", "--epochs", "1", "--batch-size", "16", "--rounds", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rounds = json.loads(out.read_text())["rounds"]
    assert [r["round"] for r in rounds] == [0, 1]
    assert all(0.0 <= r["acc_before_mean"] <= 1.0 and 0.0 <= r["acc_after_mean"] <= 1.0 for r in rounds)
    assert "round 1: before" in proc.stdout


def test_sim_speed_bench_tiny_run_prints_every_setting_and_the_breakdown(tmp_path: Path):
    out = tmp_path / "speed.json"
    args = ["--clients", "2", "--neighbours", "1", "--samples-per-client", "40", "--batch-size", "16", "--rounds", "1",
            "--skip", "0", "--processes", "1", "2", "--threads", "2", "--compare-naive", "--breakdown"]  # fmt: skip
    proc = subprocess.run([sys.executable, str(BENCH / "sim_speed.py"), *args, "--json", str(out)],
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())
    assert [(r["processes"], r["threads_per_process"], r["micro_batch"])
            for r in figures["rows"]] == [(1, 2, 0), (2, 1, 0), (1, 2, 16)]  # fmt: skip
    assert all(r["s_per_round"] > 0 and r["host_peak_gib"] > 0 for r in figures["rows"])
    assert figures["breakdown"]["round_s"] > 0 and "(eager steps; 1 process" in proc.stdout
    assert figures["breakdown"]["training compute (forward, backward, SGD)"] > 0  # train_masked's time
    assert not any(r["cuda_graphs"] for r in figures["rows"])
    refused = subprocess.run([sys.executable, str(BENCH / "sim_speed.py"), "--cuda-graphs"],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert refused.returncode == 2 and "--cuda-graphs needs --device cuda" in refused.stderr
    refused = subprocess.run([sys.executable, str(BENCH / "sim_speed.py"), "--breakdown", "graphs"],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert refused.returncode == 2 and "--breakdown graphs profiles that row" in refused.stderr
    refused = subprocess.run([sys.executable, str(BENCH / "sim_speed.py"), "--repeats", "0"],
                             capture_output=True, text=True, timeout=120)  # fmt: skip
    assert refused.returncode == 2 and "or 0 with --breakdown" in refused.stderr
    alone = subprocess.run([sys.executable, str(BENCH / "sim_speed.py"), *args[:10], "--processes", "1",
                            "--repeats", "0", "--breakdown", "--json", str(out)],
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    assert alone.returncode == 0, alone.stderr
    figures = json.loads(out.read_text())
    assert figures["rows"] == [] and figures["breakdown"]["round_s"] > 0 and "(eager steps; 1" in alone.stdout


def test_sim_speed_breakdown_counts_the_main_thread_alone_while_another_thread_runs_python() -> None:
    """The sampler splits the round's wall time by the main thread's stack; a busy helper thread counts nowhere.

    (The cProfile breakdown it replaced printed negative parts on Python 3.12, with the round's helper threads.)
    """
    import importlib
    import threading
    import time

    sys.path.insert(0, str(BENCH))
    try:
        sim_speed = importlib.import_module("sim_speed")
    finally:
        sys.path.remove(str(BENCH))
    source = (  # named as the breakdown knows them, "compiled" from a file under methods/ as Method.round is
        "def spin(seconds):\n    end = time.perf_counter() + seconds\n"
        "    while time.perf_counter() < end:\n        pass\n"
        "def train_masked():\n    time.sleep(0.5)\n"  # waits as the main thread waits in torch: GIL released
        "def update_mask(stop):\n    while not stop.is_set():\n        spin(0.001)\n        time.sleep(0.0005)\n"
        "def round():\n    train_masked()\n    time.sleep(0.3)\n"
    )
    names: dict = {"time": time}
    exec(compile(source, "edge_node/sim/methods/fake.py", "exec"), names)
    stop = threading.Event()
    helper = threading.Thread(target=names["update_mask"], args=(stop,))
    helper.start()
    try:
        with sim_speed.MainThreadSampler() as sampler:
            time.sleep(0.05)  # outside the round: counts nowhere
            names["round"]()
    finally:
        stop.set()
        helper.join()
    seconds = sampler.seconds
    assert all(v >= 0 for v in seconds.values()) and sampler.samples >= 20
    assert seconds["mask update (prune, regrow)"] == 0.0  # the helper thread's function
    # wide bounds: a sample the loaded machine delays counts its whole wait to the stack it then finds
    assert 0.35 < seconds["training compute (forward, backward, SGD)"] < 1.0
    assert 0.15 < seconds[sim_speed.REST] < 0.6
    assert sum(seconds.values()) < 1.5


def test_graphs_check_smoke_run_on_the_cpu_and_its_refusal_without_cuda(tmp_path: Path):
    """bench/graphs_check.py's code runs (--device cpu: the step uncaptured); without CUDA it says so, exit 2."""
    out = tmp_path / "graphs.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "graphs_check.py"), "--device", "cpu", "--models", "cnn", "--steps", "2",
         "--timed-steps", "1", "--skip-sim", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(out.read_text())["steps"]
    assert row["steps"] == 2 and row["graphed_vs_eager_max_abs"] <= 1e-6 and "graphs_check: ok" in proc.stdout
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(BENCH / "graphs_check.py"), "--skip-sim"], capture_output=True,
                          text=True, timeout=120, env=env)  # fmt: skip
    assert proc.returncode == 2 and proc.stderr.strip().startswith("graphs_check: CUDA is not available"), proc.stderr


def test_handover_latency_bench_prints_both_runtimes_and_the_time_to_readable(tmp_path: Path):
    out = tmp_path / "handover.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "handover_latency.py"), "--calls", "20", "--rounds", "1", "--test-samples", "20",
         "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())
    assert figures["onnxruntime_p50_ms"] > 0 and figures["torch_p99_ms"] > 0
    assert figures["round_end_to_readable_s_best"] > 0 and "torch / onnxruntime at p50" in proc.stdout


def test_data_folder_bench_reads_a_folder_larger_than_its_bound(tmp_path: Path):
    out = tmp_path / "folder.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "data_folder.py"), "--files", "400", "--arrive", "50", "--max-train", "100",
         "--max-test", "20", "--dir", str(tmp_path / "d"), "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    first, again, arrived = json.loads(out.read_text())["reads"]
    assert (first["listed"], first["train"], first["test"], first["decoded"]) == (400, 100, 20, 120), first
    assert again["decoded"] == 0 and arrived["listed"] == 450 and 0 < arrived["decoded"] <= 50, (again, arrived)
    assert not (tmp_path / "d" / "data").exists() and "| arrived |" in proc.stdout


def test_peer_exchange_bench_quick_counts_dials_within_their_bound(tmp_path: Path):
    out = tmp_path / "pex.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "peer_exchange.py"), "--quick", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(out.read_text())
    assert figures["pulls"]["during"] > 0 and figures["refusals"]  # the liar's entries were refused and counted
    # the bound of dials is a property of the code, not a timing: 16 per 1 s interval, 4 per address
    cycles = figures["exchange"]["cycles"]
    assert sum(figures["dials_to_victims"].values()) <= 16 * cycles
    assert max(figures["dials_to_victims"].values()) <= 4 * cycles


def test_hostile_bench_hello_flood_measures_the_node_with_the_rate_off_and_on(tmp_path: Path):
    out = tmp_path / "flood.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH / "hostile.py"), "--flood", "--quick", "--flood-seconds", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = {row["setting"]: row for row in json.loads(out.read_text())["hello_flood"]}
    assert rows["off"]["refusals"] == {} and rows["on"]["refusals"]["host-rate"] > 0
    assert all(row[phase]["node_cpu_per_s"] > 0 for row in rows.values() for phase in ("quiet", "one channel"))
    assert rows["on"]["one channel"]["failed"] == {"hello": 0, "pull": 0}  # the honest peer is another host
