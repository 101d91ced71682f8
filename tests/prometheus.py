"""A real Prometheus server (Debian's ``prometheus`` package) on 127.0.0.1 for tests, and plain scrapes.

    with PrometheusServer(tmp_path, ["127.0.0.1:9478"]) as prom:
        value = prom.wait_for("edge_node_rounds_total", timeout_s=60)

Its config, data and log live in a temporary directory; the process is killed and reaped on exit, also
when the test fails. Every wait is bounded in time.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from edge_node.fleet.fleet import free_ports

PROMETHEUS = shutil.which("prometheus")
SCRAPE_INTERVAL_S = 1


def scrape(address: str, timeout_s: float = 5.0) -> dict[str, float]:
    """``/metrics`` of ``HOST:PORT`` parsed by prometheus_client's own parser: ``{'name{label="v",...}': value}``."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=timeout_s) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


class PrometheusServer:
    """``prometheus`` scraping ``targets`` every second, its API on a free 127.0.0.1 port."""

    def __init__(self, work: Path, targets: list[str]) -> None:
        assert PROMETHEUS is not None, "prometheus is not installed (apt-get install prometheus)"
        self.work = work
        self.work.mkdir(parents=True, exist_ok=True)
        (self.port,) = free_ports(1)
        config = self.work / "prometheus.yml"
        config.write_text(
            f"global:\n  scrape_interval: {SCRAPE_INTERVAL_S}s\n  scrape_timeout: {SCRAPE_INTERVAL_S}s\n"
            f"scrape_configs:\n  - job_name: edge-node\n    static_configs:\n      - targets: {json.dumps(targets)}\n"
        )
        self.command = [
            PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={self.work / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn",
        ]  # fmt: skip
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> PrometheusServer:
        self.log = open(self.work / "prometheus.log", "wb")  # noqa: SIM115 -- closed in __exit__
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()

    def answer(self, expression: str) -> dict:
        """The API's whole answer for ``expression`` (``status`` "error" with ``error`` for a bad expression)."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return dict(json.loads(response.read()))
        except urllib.error.HTTPError as exc:  # 400 for a bad expression, with the JSON error body
            return dict(json.loads(exc.read()))
        except OSError as exc:
            return {"status": "unreachable", "error": str(exc)}

    def query(self, expression: str) -> list[dict]:
        """The API's instant vector for ``expression`` (empty while Prometheus starts or has no sample)."""
        body = self.answer(expression)
        return list(body.get("data", {}).get("result", [])) if body.get("status") == "success" else []

    def wait_for(self, expression: str, timeout_s: float) -> list[dict]:
        """Poll ``query(expression)`` until it has a result; the log tail in the failure."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, (self.work / "prometheus.log").read_text()
            result = self.query(expression)
            if result:
                return result
            time.sleep(0.5)
        raise AssertionError(f"no {expression} after {timeout_s} s: " + (self.work / "prometheus.log").read_text())
