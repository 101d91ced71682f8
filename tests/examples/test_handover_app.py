"""``examples/handover_app`` against a real daemon: the app answers from the handed-over model while the node
hands over a new one each round; no request ever fails once the first model is there, no answer mixes two
models, and the app follows the node to its last round. Small: a 12-feature MLP, 240 samples, 4 rounds."""

from __future__ import annotations

import hashlib
import io
import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from edge_node.fleet.fleet import free_ports
from edge_node.handover import PAIR_INFO, PAIR_ONNX, handover_dir, pair_folders, read_pair
from tests.conftest import REPO_ROOT
from tests.daemons import NodeProcesses

APP = REPO_ROOT / "examples" / "handover_app" / "serve.py"
P = "tests.plugin_factories"
ROUNDS = 4


def _post(url: str, sample: np.ndarray) -> tuple[int, dict]:
    buffer = io.BytesIO()
    np.save(buffer, sample)
    request = urllib.request.Request(url, data=buffer.getvalue(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def test_the_example_app_follows_a_running_node_without_a_failed_or_mixed_read(tmp_path: Path):
    node_port, app_port = free_ports(2)
    state = tmp_path / "n0"
    args = ["--fleet", "lab", "--insecure", "--threads", "1", "--epochs", "1", "--energy-backend", "estimate",
            "--model", f"{P}:tiny_mlp", "--dataset", f"{P}:blobs", "--capacity", "0.6", "--discovery", "static",
            "--peers", "127.0.0.1:1", "--listen", f"127.0.0.1:{node_port}", "--rounds", str(ROUNDS),
            "--handover", "latest"]  # fmt: skip
    url = f"http://127.0.0.1:{app_port}/predict"
    sample = np.linspace(-1.0, 1.0, 12, dtype=np.float32)
    answers: list[tuple[int, dict]] = []
    direct: list[str] = []  # failures of a second reader following the pointer itself
    with NodeProcesses() as nodes:
        state.mkdir()
        app = subprocess.Popen(
            [sys.executable, str(APP), "--state-dir", str(state), "--port", str(app_port), "--poll-s", "0"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        try:
            node = nodes.start("n0", state, args)
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                try:
                    answers.append(_post(url, sample))
                except (urllib.error.URLError, ConnectionError):
                    assert app.poll() is None, app.stdout.read() if app.stdout else ""
                    time.sleep(0.2)  # the app is still starting
                    continue
                try:
                    read_pair(state)
                except Exception as exc:  # noqa: BLE001 -- any failure is what the test looks for
                    direct.append(repr(exc))
                if answers[-1][0] == 200 and answers[-1][1]["round"] == ROUNDS:
                    break
            node.signal(signal.SIGTERM)
            assert node.wait(60) == 0, node.log()
        finally:
            app.kill()
            app.wait(10)
    served = [body for status, body in answers if status == 200]
    first = next(i for i, (status, _) in enumerate(answers) if status == 200)
    assert all(status == 503 for status, _ in answers[:first]), answers[:first]  # before the first handover
    assert all(status == 200 for status, _ in answers[first:]), [a for a in answers[first:] if a[0] != 200][:3]
    assert not direct, direct[:3]
    rounds = [body["round"] for body in served]
    assert rounds == sorted(rounds) and rounds[-1] == ROUNDS and len(set(rounds)) >= 2, rounds
    sha_of_round: dict[int, str] = {}
    for body in served:  # one model per round: an answer names the round and the bytes of one and the same pair
        assert sha_of_round.setdefault(body["round"], body["onnx_sha256"]) == body["onnx_sha256"], body
        assert len(body["outputs"][0]) == 3 and len(body["top"][0]) == 3
    kept = pair_folders(handover_dir(state))
    assert len(kept) == 3  # handover_keep's default
    for folder in kept:
        info = json.loads((folder / PAIR_INFO).read_text())
        assert hashlib.sha256((folder / PAIR_ONNX).read_bytes()).hexdigest() == info["onnx_sha256"]
        assert sha_of_round.get(info["round"], info["onnx_sha256"]) == info["onnx_sha256"]
