"""A device's application beside its edge-node daemon: serves predictions of the model the node handed over.

    python examples/handover_app/serve.py --state-dir /var/lib/edge-node --port 8080

    curl localhost:8080/model                                  # model.json of the model in use
    python -c "import numpy as np; np.save('x.npy', np.random.rand(3, 32, 32).astype('float32'))"
    curl --data-binary @x.npy localhost:8080/predict           # {"round": 7, "folder": ..., "outputs": ...}

It needs numpy and onnxruntime (and edge-node's reader, ``edge_node.handover_model``), not torch. Before a
request it asks, at most once every ``--poll-s`` seconds, whether the node has handed over a newer model
(``reload_if_changed``: one small file read) and swaps it in; a request in progress finishes on the model it
started with. Until the node's first handover it answers 503. A sample it cannot take (shape, dtype, range)
is a 400 with the one-line reason.
"""

from __future__ import annotations

import argparse
import io
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np

from edge_node.errors import HandoverError
from edge_node.handover_model import HandedOverModel, load_handover


class Predictor:
    """The handed-over model, reloaded when the node hands over a newer one (checked every ``poll_s``)."""

    def __init__(self, state_dir: Path, poll_s: float = 1.0, threads: int | None = 1) -> None:
        self.state_dir, self.poll_s, self.threads = state_dir, poll_s, threads
        self.model: HandedOverModel | None = None
        self._checked = 0.0
        self._lock = threading.Lock()

    def current(self) -> HandedOverModel | None:
        """The model to answer with now (None until the node's first handover)."""
        now = time.monotonic()
        with self._lock:
            if now - self._checked >= self.poll_s:
                self._checked = now
                try:
                    if self.model is None:
                        self.model = load_handover(self.state_dir, threads=self.threads)
                    else:
                        self.model.reload_if_changed()
                except HandoverError:
                    pass  # none yet: 503 below; a broken newer pair keeps the one in use
            return self.model

    def predict(self, sample: np.ndarray) -> dict[str, Any]:
        model = self.current()
        if model is None:
            raise LookupError("no model handed over yet")
        prediction = model.run(sample, "request")  # outputs and model.json of one and the same model
        info = prediction.info
        answer: dict[str, Any] = {"round": info["round"], "onnx_sha256": info["onnx_sha256"],
                                  "outputs": prediction.outputs.tolist()}  # fmt: skip
        if info["task"] == "classification":
            answer["top"] = prediction.top(3)
        return answer


def make_handler(predictor: Predictor) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def _send(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 -- http.server's name
            model = predictor.current()
            if self.path != "/model":
                self._send(404, {"error": "GET /model or POST /predict"})
            elif model is None:
                self._send(503, {"error": "no model handed over yet"})
            else:
                self._send(200, model.info)

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/predict":
                self._send(404, {"error": "POST /predict with a .npy body"})
                return
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                sample = np.load(io.BytesIO(body), allow_pickle=False)
                self._send(200, predictor.predict(sample))
            except LookupError as exc:
                self._send(503, {"error": str(exc)})
            except (HandoverError, ValueError, OSError) as exc:
                self._send(400, {"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__})

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- quiet: one line per request is noise
            pass

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", type=Path, default=Path("/var/lib/edge-node"))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--poll-s", type=float, default=1.0, help="How often to look for a newer model.")
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), make_handler(Predictor(args.state_dir, args.poll_s)))
    print(f"serving the model handed over in {args.state_dir} on http://{args.host}:{args.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
