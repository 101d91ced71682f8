"""``edge-node capacity``: measure this device and show the tier ``--capacity auto`` would pick, and why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from edge_node.cli._app import app
from edge_node.cli._node_options import load_node_config, node_options


def format_decision(decision: Any) -> str:
    m = decision.measurements
    lines = [
        f"training throughput  {m.train_samples_per_s:.1f} samples/s ({m.probe_steps} steps of {m.probe_batch_size}"
        f" samples in {m.probe_s:.1f} s, after {m.warmup_s:.1f} s of warm-up; probe {m.probe_total_s:.1f} s in all)",
        f"activation memory    {m.activation_bytes / 2**20:.0f} MiB (resident growth during the probe)",
        f"available memory     {m.available_memory_bytes / 2**30:.2f} GiB",
        f"CPUs                 {m.cpu_count} ({m.torch_threads} torch threads)",
        f"cgroup limits        {m.limits_detail or '-'}",
        f"accelerator          {m.accelerator}",
        f"link speed           {m.link_detail}",
        "",
    ]
    if m.tiers:  # width tiers: every tier's own narrow model, timed (the line above is tier 1.0's, the full model)
        lines.append("tier  width  FLOP share  samples/s  step x full  from")
        for t in m.tiers:
            timed = f" ({t.probe_steps} steps of {t.probe_batch_size} in {t.probe_s:.1f} s)" if t.probe_steps else ""
            lines.append(f"{t.tier:>4}  {t.width:5.2f}  {t.flop_share:10.2f}  {t.train_samples_per_s:9.1f}  "
                         f"{t.step_ratio:11.2f}  {t.source}{timed}")  # fmt: skip
        lines.append("")
    lines.append("density  train s  transfer s  round s  memory MiB  fits")
    for c in decision.checks:
        transfer = "-" if c.transfer_s is None else f"{c.transfer_s:.1f}"
        lines.append(
            f"{c.density:7.1f}  {c.train_s:7.1f}  {transfer:>10}  {c.round_s:7.1f}  {c.memory_bytes / 2**20:10.0f}  "
            + ("yes" if c.fits else f"no: {c.failed}")
        )
    lines += ["", f"tier {decision.tier}: {decision.decided_by}"]
    return "\n".join(lines)


@app.command(context_settings={"max_content_width": 120})
@click.option("--json", "as_json", is_flag=True, help="Print the measurements and decision as JSON.")
@node_options
def capacity(as_json: bool, config_file: Path | None, **flags: Any) -> None:
    """Measure throughput, memory, CPUs, accelerator and link; print every tier's check and the one chosen.

    Takes the node's settings (model, data, epochs, neighbours, round budget, threads, device, fleet
    seed) like ``start`` and measures through the same code as ``start --capacity auto``; starts
    nothing. A dense-kernel device's tiers differ only in the bytes on the wire (see the README), except
    under --tier-mode width or both, where each tier's own narrow model is timed too.
    """
    from edge_node.node import capacity as cap
    from edge_node.node.local_data import load_local_data
    from edge_node.node.local_model import node_model

    config = load_node_config(config_file, flags)
    device, _ = cap.runtime_device(config)  # --threads and --device as the daemon applies them
    local = load_local_data(config, config.resolved_client_index, device)
    _, spec = node_model(config, local)
    decision = cap.measure(config, local, spec, device)
    click.echo(json.dumps(decision.to_json(), indent=1) if as_json else format_decision(decision))
