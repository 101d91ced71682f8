"""``edge-node simulate`` end to end on the built-in demo set: outputs, accounting, resume, bad input."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edge_node.cli import main
from edge_node.records import per_node

SMALL = [
    "simulate",
    "--dataset",
    "demo",
    "--clients",
    "6",
    "--neighbours",
    "2",
    "--epochs",
    "1",
    "--samples-per-client",
    "150",
    "--no-progress",
    "--energy-backend",
    "estimate",
]


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as exc:
        main(args)
    return int(exc.value.code or 0)


def rounds(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rounds.jsonl").read_text().splitlines()]


def strip_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in records]


@pytest.fixture(scope="module")
def two_round_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("sim") / "run"
    assert run_cli([*SMALL, "--rounds", "2", "--output", str(out)]) == 0
    return out


def test_run_writes_reports_with_consistent_accounting(two_round_run: Path):
    records = rounds(two_round_run)
    assert [r["round"] for r in records] == [0, 1]
    for r in records:
        assert len(r["nodes"]) == 6 and all(0.0 <= a <= 1.0 for a in per_node(r, "acc_after"))
        assert sum(per_node(r, "bytes_out")) == sum(per_node(r, "bytes_in")) > 0  # every pulled byte was served
        assert r["busiest_node_bytes"] == max(n["bytes_out"] + n["bytes_in"] for n in r["nodes"])
        assert r["modelled_energy"]["label"] == "modelled"
        # 2 neighbours x ~half of the cnn's 797,962 parameters x 4 bytes
        assert r["paper_comm_mb_mean"] == pytest.approx(2 * 0.5 * 797_962 * 4 / 1e6, rel=0.01)
    assert records[1]["acc_after_mean"] > 0.15  # above chance (0.1) after two rounds on the demo set
    for name in ("summary.json", "config.json", "accuracy.png", "communication.png", "energy.jsonl"):
        assert (two_round_run / name).is_file(), name
    assert (two_round_run / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    energy = [json.loads(line) for line in (two_round_run / "energy.jsonl").read_text().splitlines()]
    assert len(energy) == 2 and not any(e["measured"] for e in energy)
    summary = json.loads((two_round_run / "summary.json").read_text())
    assert set(summary["machine_energy"]) == {"estimated"}  # no meter here: never called measured
    assert summary["machine_energy"]["estimated"]["total_j"] == pytest.approx(sum(e["total_j"] for e in energy))


def test_resume_continues_exactly_where_it_stopped(two_round_run: Path, tmp_path: Path):
    out = tmp_path / "resumed"
    assert run_cli([*SMALL, "--rounds", "1", "--planned-rounds", "2", "--output", str(out)]) == 0
    assert len(rounds(out)) == 1
    assert run_cli([*SMALL, "--rounds", "2", "--planned-rounds", "2", "--output", str(out)]) == 0
    straight = json.loads((two_round_run / "config.json").read_text())
    assert straight["rounds"] == 2
    assert strip_timing(rounds(out)) == strip_timing(rounds(two_round_run))


def test_resume_with_other_settings_is_refused(two_round_run: Path, capsys):
    before = (two_round_run / "rounds.jsonl").read_text()
    assert run_cli([*SMALL, "--rounds", "3", "--seed", "9", "--output", str(two_round_run)]) == 2
    assert "seed" in capsys.readouterr().err
    assert (two_round_run / "rounds.jsonl").read_text() == before


def test_fresh_with_invalid_settings_keeps_the_old_run(two_round_run: Path, capsys):
    before = {f.name: f.read_bytes() for f in two_round_run.iterdir()}
    # 6 clients x 5000 samples exceed the demo set: refused after --fresh was asked, before it acts
    args = [*SMALL, "--rounds", "1", "--fresh", "--output", str(two_round_run), "--samples-per-client", "5000"]
    assert run_cli(args) == 2
    assert "samples_per_client=5000" in capsys.readouterr().err
    assert {f.name: f.read_bytes() for f in two_round_run.iterdir()} == before


def test_setting_ii_with_gradient_regrowth(tmp_path: Path, capsys):
    out = tmp_path / "ii"
    assert run_cli([*SMALL, "--rounds", "1", "--setting", "ii", "--regrow", "gradient", "--output", str(out)]) == 0
    (record,) = rounds(out)
    # --no-progress (SMALL) turns bars off, not the one line per round that replaces them
    # (and a busy machine's slow round adds "round 1/1: 4 of 6 clients, 19 s" lines on the way)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("round ")]
    finals = [line for line in lines if line.startswith("round 1/1: acc ")]
    assert len(finals) == 1 and "busiest node client-" in finals[0] and lines[-1] == finals[0]
    assert all(re.fullmatch(r"round 1/1: \d of 6 clients, \d+ s", line) for line in lines[:-1]), lines
    # gradient regrowth adds B * 3 * F(dense) to each client's FLOPs
    assert record["flops_per_client_max"] > 1 * 150 * 3 * 0.2 * record["forward_flops_dense"]
    assert record["densities_target"] == [0.2, 0.4, 0.6, 0.8, 1.0]
    # clients 0..5 get tiers 0.2, 0.4, 0.6, 0.8, 1.0, 0.2
    assert record["density_mean"] == pytest.approx((0.2 + 0.4 + 0.6 + 0.8 + 1.0 + 0.2) / 6, abs=0.01)


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--model", "resnet50"], "model='resnet50' must be one of cnn, resnet18, vgg11"),
        (["--model", "no_such_package.nets:mlp"], "model factory 'no_such_package.nets:mlp': no module"),
        (["--dataset", "no_such_package.rows:load"], "data factory 'no_such_package.rows:load': no module"),
        (["--method", "fedprox"], "'fedprox' is not one of"),
        (["--energy-backend", "foo"], "'foo' is not one of"),
        (["--density", "1.5"], "density=1.5"),
        (["--density", "0"], "density=0.0"),
        (["--neighbours", "6"], "neighbours=6"),
        (["--dataset", "cifar10", "--data-dir", "/nonexistent/cifar"], "/nonexistent/cifar"),
        (["--partition", "zipf:2"], "zipf"),
        (["--density", "0.3", "--setting", "ii"], "--setting ii"),
        (["--cuda-graphs"], "cuda_graphs needs device cuda"),
        (["--cuda-graphs", "--device", "cuda", "--micro-batch", "16"], "cuda_graphs captures whole batches: it needs"),
        (["--tier-mode", "width", "--method", "fedavg"], "tier_mode width is not implemented for method fedavg"),
        (["--tier-mode", "depth"], "'depth' is not one of"),
        (["--tier-mode", "both"], "tier_mode both takes the width from a client's tier"),
        (
            [
                "--tier-mode",
                "width",
                "--model",
                "tests.plugin_factories:tiny_mlp",
                "--dataset",
                "tests.plugin_factories:blobs",
                "--samples-per-client",
                "20",
                "--density",
                "0.6",
            ],
            "does not accept a width argument",
        ),  # fmt: skip
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path: Path, capsys, extra, needle):
    out = tmp_path / "never"
    assert run_cli([*SMALL, "--rounds", "1", "--output", str(out), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("edge-node: error:") and needle in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_cuda_without_a_gpu_is_refused_before_any_data_is_decoded(tmp_path: Path, capsys, monkeypatch):
    import torch

    import edge_node.data

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # edge_node.api.run_simulation loads the data:
    monkeypatch.setattr(edge_node.data, "load_dataset", lambda *a, **k: pytest.fail("data decoded before the check"))
    out = tmp_path / "never"
    assert run_cli([*SMALL, "--rounds", "1", "--device", "cuda", "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("edge-node: error:") and "cuda" in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_corrupt_dataset_archive_is_refused(tmp_path: Path):
    bad = tmp_path / "cifar.tar.gz"
    bad.write_bytes(b"this is not a gzip file")
    out = tmp_path / "never"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "edge_node",
            *SMALL,
            "--rounds",
            "1",
            "--dataset",
            "cifar10",
            "--data-dir",
            str(bad),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr
    assert "cifar.tar.gz" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_a_diverging_run_stops_with_exit_5_keeping_earlier_rounds(tmp_path: Path, capsys):
    """lr=1e20: the loss turns NaN within a round or two. No accuracy of a NaN model is ever recorded."""
    out = tmp_path / "nan"
    assert run_cli([*SMALL, "--rounds", "3", "--lr", "1e20", "--output", str(out)]) == 5
    err = capsys.readouterr().err.strip().splitlines()[-1]
    found = re.match(r"edge-node: error: training diverged in round (\d+): client \d+ has loss nan", err)
    assert found and "lower --lr" in err, err
    diverged = int(found.group(1))  # counted from 1, as every line a person reads: the records before it are kept
    recorded = rounds(out) if (out / "rounds.jsonl").exists() else []
    assert [r["round"] for r in recorded] == list(range(diverged - 1))


def _snapshot(run_dir: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in run_dir.iterdir()}


def test_fresh_with_a_meter_that_cannot_be_opened_keeps_the_old_run(two_round_run: Path, capsys):
    assert shutil.which("vcgencmd") is None, "this test needs a machine without the Raspberry Pi tool"
    before = _snapshot(two_round_run)
    args = [*SMALL, "--rounds", "3", "--fresh", "--energy-backend", "rpi5", "--output", str(two_round_run)]
    assert run_cli(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines()[-1].startswith("edge-node: error:") and "Traceback" not in err, err
    assert "rpi5" in err.splitlines()[-1] or "vcgencmd" in err.splitlines()[-1], err
    assert _snapshot(two_round_run) == before


def test_config_json_reproduces_a_run_and_a_pipe_gets_one_line_per_round(two_round_run: Path, tmp_path: Path):
    """config.json fed back (--config) gives the same records; flags override it (--output, --progress);
    stderr is a pipe here, so progress is one line per round, no bars, no carriage returns."""
    out = tmp_path / "again"
    proc = subprocess.run(
        [sys.executable, "-m", "edge_node", "simulate", "--config", str(two_round_run / "config.json"),
         "--output", str(out), "--progress"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert strip_timing(rounds(out)) == strip_timing(rounds(two_round_run))
    lines = [line for line in proc.stderr.splitlines() if line.startswith("round ") and ": acc " in line]
    assert [line.split(":")[0] for line in lines] == ["round 1/2", "round 2/2"], proc.stderr
    within = [line for line in proc.stderr.splitlines() if line.startswith("round ") and ": acc " not in line]
    assert all(re.fullmatch(r"round [12]/2: \d of 6 clients, \d+ s", line) for line in within), within
    assert "acc " in lines[0] and "busiest node" in lines[0]
    assert "\r" not in proc.stderr


# SimConfig's fields before the reference partitions and the baselines (commit 6dae983): a run saved then.
OLD_SETTINGS = (
    "method", "dataset", "data_dir", "model", "clients", "neighbours", "topology", "max_in_degree", "rounds",
    "planned_rounds", "epochs", "batch_size", "lr", "lr_decay", "weight_decay", "clip_norm", "density", "setting",
    "mask_init", "regrow", "prune_alpha", "partition", "samples_per_client", "seed", "device", "output",
    "eval_batch_size", "energy_backend", "progress",
)  # fmt: skip


def _as_saved_before_partition_variants(run: Path) -> None:
    """Rewrite ``run``'s checkpoint and config.json in the old form: only OLD_SETTINGS, and the balanced
    procedure under its old name ``dir:`` (no partition_variant, no screen)."""
    import torch

    from edge_node.sim.checkpoint import load_checkpoint, save_checkpoint

    saved = load_checkpoint(run / "checkpoint.pt", torch.device("cpu"))
    assert saved["config"]["partition"] == "dir-balanced:0.3" and saved["config"]["screen"] is False
    old = {k: saved["config"][k] for k in OLD_SETTINGS}
    old["partition"] = "dir:0.3"
    save_checkpoint(run / "checkpoint.pt", round_index=saved["round"], config=old, weights=saved["weights"],
                    train_masks=saved["train_masks"], next_masks=saved["next_masks"])  # fmt: skip
    (run / "config.json").write_text(json.dumps(old, indent=2) + "\n")


def test_a_run_saved_before_partition_variants_resumes_as_the_balanced_one(tmp_path: Path, capsys):
    balanced = [*SMALL, "--partition", "dir-balanced:0.3", "--planned-rounds", "2"]
    straight, old = tmp_path / "straight", tmp_path / "old"
    then = [*balanced, "--no-screen", "--micro-batch", "0"]  # such runs sent whole batches
    assert run_cli([*then, "--rounds", "2", "--output", str(straight)]) == 0
    assert run_cli([*then, "--rounds", "1", "--output", str(old)]) == 0
    _as_saved_before_partition_variants(old)
    renamed = tmp_path / "renamed"
    shutil.copytree(old, renamed)
    capsys.readouterr()
    # The command as it was (dir:0.3, no --no-screen): resumed as what it ran, and said so
    assert run_cli([*SMALL, "--partition", "dir:0.3", "--planned-rounds", "2", "--rounds", "2",
                    "--output", str(old)]) == 0  # fmt: skip
    err = capsys.readouterr().err
    assert "its dir:0.3 was the balanced procedure, resumed as --partition dir-balanced:0.3" in err, err
    assert "ran without it; resumed without it (--no-screen)" in err, err
    assert "saved with micro_batch 0 (the default is 16 now); resumed with it" in err, err
    assert "(dir-balanced:0.3, balanced partition)" in err
    assert strip_timing(rounds(old)) == strip_timing(rounds(straight))
    written = json.loads((old / "config.json").read_text())
    assert written["partition"] == "dir-balanced:0.3" and written["partition_variant"] == "balanced"
    assert written["screen"] is False and written["micro_batch"] == 0
    # Today's name for it resumes too, without a note on the partition
    assert run_cli([*balanced, "--rounds", "2", "--output", str(renamed)]) == 0
    assert "balanced procedure" not in capsys.readouterr().err
    assert strip_timing(rounds(renamed)) == strip_timing(rounds(straight))


def test_a_run_saved_before_partition_variants_refuses_another_variant(tmp_path: Path, capsys):
    old = tmp_path / "old"
    assert run_cli([*SMALL, "--partition", "dir-balanced:0.3", "--no-screen", "--rounds", "1", "--output",
                    str(old)]) == 0  # fmt: skip
    _as_saved_before_partition_variants(old)
    before = _snapshot(old)
    capsys.readouterr()
    assert run_cli([*SMALL, "--partition", "dir-reuse:0.3", "--rounds", "2", "--output", str(old)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "other settings (partition" in err, err
    assert _snapshot(old) == before
    # its config.json fed back (--config) reads as what it ran, with a warning
    code, out, err = run_print_config(["--config", str(old / "config.json")], capsys)
    assert code == 0 and 'partition = "dir-balanced:0.3"' in out.splitlines() and "screen = false" in out.splitlines()
    assert "predates partition variants" in err


def run_print_config(args: list[str], capsys) -> tuple[int, str, str]:
    code = run_cli(["simulate", *args, "--print-config"])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_defaults_fit_a_first_run_and_the_output_pattern_is_the_helps(capsys):
    code, out, _ = run_print_config([], capsys)
    assert code == 0
    for line in ('clients = 4', 'neighbours = 2', 'epochs = 1', 'batch_size = 32', 'rounds = 5', 'dataset = "demo"',
                 'partition = "dir:0.3"',
                 'output = "runs/demo-cnn-dispfl-dir0.3-seed0"'):  # fmt: skip
        assert line in out.splitlines(), line
    code, out, _ = run_print_config(["--method", "fedavg", "--partition", "PATH:2", "--seed", "3"], capsys)
    assert 'output = "runs/demo-cnn-fedavg-path2-seed3"' in out.splitlines()
    assert run_cli(["simulate", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "runs/{dataset}-{model}-{method}-{partition}-seed{seed}" in "".join(help_text.split())
    for listed in ("[random|ring|full]", "[gradient|random]", "[cpu|cuda]",
                   "[dispfl|dispfl-s2s|local|dpsgd|dpsgd-ft|fedavg|fedavg-ft|fedp3|ditto|fedspa|fedspa-rsm|sub-fedavg|heterofl]",
                   "[auto|nvml|rapl|jetson|rpi5|estimate]",
                   "Model: cnn, resnet18, vgg11, an installed plug-in's name or a factory package.module:function",
                   "Data set: cifar10, cifar100, tiny-imagenet, demo"):  # fmt: skip
        assert listed in help_text, listed


@pytest.mark.parametrize(
    ("args", "warning"),
    [
        (["--topology", "ring", "--neighbours", "5"], "neighbours is ignored with topology ring"),
        (["--topology", "full", "--neighbours", "5"], "neighbours is ignored with topology full"),
        (["--method", "local", "--neighbours", "5"], "neighbours is ignored by method local"),
        (["--method", "dpsgd", "--density", "0.3"], "density is ignored by method dpsgd"),
        (["--method", "dispfl", "--fedavg-clients", "4"], "fedavg_clients is ignored by method dispfl"),
        (["--target-density", "0.3"], "target_density is ignored by method dispfl"),
        (
            ["--method", "ditto", "--cuda-graphs", "--device", "cuda", "--micro-batch", "0"],
            "cuda_graphs is ignored by method ditto",
        ),  # fmt: skip
    ],
)
def test_settings_a_run_ignores_are_named(capsys, args, warning):
    code, out, err = run_print_config(args, capsys)
    assert code == 0 and f"edge-node: warning: {warning}" in err, err
    if "--density" in args:
        assert "density = 1.0" in out.splitlines()  # the dense baselines train dense models


def test_toml_config_file_with_flags_overriding_it(tmp_path: Path, capsys):
    cfg = tmp_path / "sim.toml"
    cfg.write_text('method = "fedavg"\nclients = 6\nrounds = 9\npartition = "path-balanced:2"\n')
    code, out, _ = run_print_config(["--config", str(cfg), "--rounds", "1"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert 'method = "fedavg"' in lines and "clients = 6" in lines and "rounds = 1" in lines
    cfg.write_text("clients = 6\nneighbors = 2\n")
    code, _, err = run_print_config(["--config", str(cfg)], capsys)
    assert code == 2 and "unknown key 'neighbors'" in err and str(cfg) in err


def test_verbose_works_after_the_subcommand(capsys):
    root = logging.getLogger()
    level = root.level
    try:
        root.setLevel(logging.WARNING)
        assert run_cli(["simulate", "-v", "--print-config"]) == 0
        assert root.level == logging.INFO
        assert run_cli(["simulate", "-vv", "--print-config"]) == 0
        assert root.level == logging.DEBUG
    finally:
        root.setLevel(level)
