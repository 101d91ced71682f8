"""Wire-format benchmark: bytes per model, codec throughput, loopback gRPC pull vs a raw TCP socket.

    .venv/bin/python bench/wire.py [--json results.json] [--quick]

Bytes for cnn and resnet18 with ERK masks at densities 0.1, 0.2, 0.5, 0.8, 1.0: our encoding (exact,
``encoded_model_size``, checked once against a real encode), dense fp32, uint32-COO + fp32, and the
information-theoretic floor n*H(d) bits + nnz fp32 values (for the whole model's d, and summed per tensor with
each tensor's own density; "ours/floor" is against the latter). "vs bm+vals" is our overhead over
ceil(numel/8) bitmap bytes for each tensor sent sparse plus nnz*4 value bytes (a tensor whose mask is all true
travels dense, without a bitmap). Encode/decode throughput on one CPU thread (decode: of the serialized
messages, as a peer's stream delivers them). Time to pull ResNet18 d = 0.5 over loopback gRPC against a plain
TCP socket (a new connection each time) moving the same message bytes, as ratios measured in the same run: the
transport alone, and the whole ``pull_models`` with validation and decoding, on the channel the previous pull
kept (a node's next pull from that peer, while the peer's server keeps the idle connection: 30 s by default)
and on a new channel (a node's first pull from a peer). The serving peer runs in a process of its own, as
another node does (``--server same``: in the bench's process, where its event loop shares the puller's GIL).
Prints a table; writes JSON with ``--json``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import platform
import socket
import statistics
import struct
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import grpc
import torch

from edge_node.algorithm.masks import init_masks
from edge_node.models import build_model
from edge_node.net import ModelSnapshot, PeerAddress, PeerServer, create_server, pull_models
from edge_node.net.channels import CHANNELS
from edge_node.node.memory import configure_allocator
from edge_node.wire import (
    PROTOCOL_VERSION,
    ModelSpec,
    ValueType,
    compile_decoder,
    decode_model,
    encode_model,
    encoded_model_size,
)
from edge_node.wire.messages import GET_MODEL_METHOD, GetModelRequest

DENSITIES = (0.1, 0.2, 0.5, 0.8, 1.0)
# Pulls of each row run, and printed, before the timed ones: a process's first ResNet18 pull took 150-250 ms
# here (about 145 ms of CPU: gRPC's first channel, first-use code), its second 30-100 ms (up to 73 ms of
# system time faulting in 8,000 pages as the heap grew), the third on about 20 ms. A daemon pays that once in its
# life, not every round.
WARMUP = 3
MB = 1e6
FLEET = "bench"


def model_and_spec(name: str) -> tuple[dict[str, torch.Tensor], ModelSpec]:
    torch.manual_seed(0)  # bench only: fixed weights
    weights = {n: p.detach().clone() for n, p in build_model(name, 10).named_parameters()}
    return weights, ModelSpec.from_tensors(name, 10, weights)


def masks_for(weights: dict[str, torch.Tensor], density: float) -> dict[str, torch.Tensor]:
    return init_masks(weights, density, torch.Generator().manual_seed(1), method="erk")


def entropy_bits(p: float) -> float:
    return 0.0 if p <= 0.0 or p >= 1.0 else -(p * math.log2(p) + (1 - p) * math.log2(1 - p))


def header_kwargs(density: float) -> dict:
    return {"node_id": "bench-node", "fleet_id": FLEET, "round": 1, "density": density}


def bytes_table(names: list[str], densities: tuple[float, ...]) -> list[dict]:
    rows = []
    for name in names:
        weights, spec = model_and_spec(name)
        numel = spec.total_numel
        for density in densities:
            masks = masks_for(weights, density)
            nnz = {n: int(m.sum()) for n, m in masks.items()}
            total_nnz = sum(nnz.values())
            ours = encoded_model_size(spec, nnz, ValueType.FLOAT32, **header_kwargs(density))
            ours_fp16 = encoded_model_size(spec, nnz, ValueType.FLOAT16, **header_kwargs(density))
            # tensors whose mask is all true travel dense, without a bitmap (DESIGN.md "Wire format"),
            # so the reference counts ceil(numel/8) bitmap bytes only for the tensors sent sparse
            bitmap_plus_values = sum(-(-spec.numel(n) // 8) for n in nnz if nnz[n] < spec.numel(n)) + total_nnz * 4
            rows.append(
                {
                    "model": name,
                    "density": density,
                    "numel": numel,
                    "nnz": total_nnz,
                    "ours_fp32": ours,
                    "ours_fp16": ours_fp16,
                    "dense_fp32": numel * 4,
                    "coo_u32_fp32": total_nnz * 8,
                    "floor_bits_plus_fp32": numel * entropy_bits(total_nnz / numel) / 8 + total_nnz * 4,
                    # the floor when each tensor's own density is known (ERK makes small tensors dense)
                    "floor_per_tensor_plus_fp32": sum(
                        spec.numel(n) * entropy_bits(nnz[n] / max(1, spec.numel(n))) / 8 for n in nnz
                    )
                    + total_nnz * 4,
                    "bitmap_plus_values": bitmap_plus_values,
                    "all_bitmaps_plus_values": numel / 8 + total_nnz * 4,  # as if every tensor had a bitmap
                    "overhead_vs_bitmap_plus_values_pct": 100 * (ours - bitmap_plus_values) / bitmap_plus_values,
                }
            )
        # the size count is exact: check it once per model against a real encode
        masks = masks_for(weights, 0.5)
        real = sum(m.ByteSize() for m in encode_model(spec, weights, masks, **header_kwargs(0.5)))
        expected = next(r["ours_fp32"] for r in rows if r["model"] == name and r["density"] == 0.5)
        assert real == expected, f"encoded_model_size {expected} != real {real} for {name}"
    return rows


def codec_speed(name: str, density: float, repeats: int) -> dict:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    compile_decoder()  # as a daemon does at start: the first decode would time numba's compiler
    weights, spec = model_and_spec(name)
    masks = masks_for(weights, density)
    out = {"model": name, "density": density}
    for value_type in (ValueType.FLOAT32, ValueType.FLOAT16):
        enc, dec = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            messages = encode_model(spec, weights, masks, value_type=value_type, **header_kwargs(density))
            enc.append(time.perf_counter() - start)
            received = [m.SerializeToString() for m in messages]  # what a peer's stream delivers
            start = time.perf_counter()
            decode_model(received, spec, FLEET)
            dec.append(time.perf_counter() - start)
        size = sum(m.ByteSize() for m in messages)
        key = value_type.name.lower()
        out[f"{key}_wire_bytes"] = size
        out[f"{key}_encode_s"] = min(enc)
        out[f"{key}_decode_s"] = min(dec)
        out[f"{key}_encode_MBps"] = size / MB / min(enc)
        out[f"{key}_decode_MBps"] = size / MB / min(dec)
        out[f"{key}_encode_plus_decode_s"] = min(enc) + min(dec)
    torch.set_num_threads(threads)
    return out


def _raw_socket_time(frames: list[bytes]) -> float:
    """Seconds for a TCP socket on 127.0.0.1 to move ``frames`` (length-prefixed) to a reader."""
    total = sum(len(f) for f in frames)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def send() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(1)  # the "request"
                for frame in frames:
                    conn.sendall(struct.pack("<I", len(frame)))
                    conn.sendall(frame)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        start = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
            client.sendall(b"g")
            received = 0
            buffer = bytearray(1 << 20)
            view = memoryview(buffer)
            while received < total + 4 * len(frames):
                n = client.recv_into(view)
                if n == 0:
                    break
                received += n
        elapsed = time.perf_counter() - start
        sender.join(10)
    assert received == total + 4 * len(frames), (received, total)
    return elapsed


def _grpc_transport_time(port: int, spec: ModelSpec) -> tuple[float, int]:
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.max_receive_message_length", 4 << 20)]) as ch:
        call = ch.unary_stream(
            GET_MODEL_METHOD, request_serializer=GetModelRequest.SerializeToString, response_deserializer=bytes
        )
        request = GetModelRequest(protocol_version=PROTOCOL_VERSION, fleet_id=FLEET, arch_id=spec.arch_id)
        grpc.channel_ready_future(ch).result(timeout=10)
        start = time.perf_counter()
        size = sum(len(m) for m in call(request, timeout=60))
        return time.perf_counter() - start, size


def _pull_time(peer: PeerAddress, spec: ModelSpec) -> float:
    """Seconds for ``pull_models`` to pull, validate and decode ``peer``'s model."""
    start = time.perf_counter()
    result = pull_models([peer], spec, FLEET, insecure=True)
    elapsed = time.perf_counter() - start
    assert not result.failures, result.failures
    return elapsed


def _apply_malloc(malloc: str) -> None:
    """``daemon``: the allocator settings ``edge-node start`` makes before any thread; ``default``: glibc's own."""
    if malloc == "daemon":
        configure_allocator()


def _start_server(name: str, density: float, value_type: ValueType) -> tuple[grpc.Server, int]:
    weights, spec = model_and_spec(name)
    peer = PeerServer(spec, node_id="bench-node", fleet_id=FLEET, value_type=value_type)
    peer.publish(ModelSnapshot(weights, masks_for(weights, density), 1, density, "bench-node", FLEET, spec.arch_id))
    server, port = create_server("127.0.0.1:0", peer, insecure=True)
    server.start()
    return server, port


def _serve(name: str, density: float, value_type: ValueType, malloc: str, conn: Connection) -> None:
    """The peer in a process of its own, as another node is: send the port, serve until told to stop."""
    _apply_malloc(malloc)
    server, port = _start_server(name, density, value_type)
    conn.send(port)
    conn.recv()
    server.stop(None).wait(10)


@contextlib.contextmanager
def _child(target: Callable[..., None], *args: object) -> Iterator[Connection]:
    """A spawned process running ``target(*args, conn)``; yields our end of the pipe, joins it on exit
    (killed if it has not ended 30 s later)."""
    context = multiprocessing.get_context("spawn")
    ours, theirs = context.Pipe()
    child = context.Process(target=target, args=(*args, theirs))
    child.start()
    try:
        yield ours
    finally:
        child.join(30)
        if child.is_alive():
            child.kill()
            child.join(5)


def _receive(conn: Connection, timeout_s: float, what: str) -> Any:
    if not conn.poll(timeout_s):
        raise RuntimeError(f"{what} within {timeout_s:g} s")
    return conn.recv()


@contextlib.contextmanager
def serving(name: str, density: float, value_type: ValueType, separate: bool, malloc: str = "default") -> Iterator[int]:
    """A peer serving the bench model: in a child process (``separate``), or in this one."""
    if not separate:
        server, port = _start_server(name, density, value_type)
        try:
            yield port
        finally:
            server.stop(None).wait(10)
        return
    with _child(_serve, name, density, value_type, malloc) as conn:
        try:
            yield _receive(conn, 300, "the serving process did not start")
        finally:
            conn.send("stop")


def pull_speed(
    repeats: int,
    name: str = "resnet18",
    density: float = 0.5,
    value_type: ValueType = ValueType.FLOAT32,
    separate: bool = True,
    malloc: str = "default",
) -> dict:
    """Raw TCP, the bare gRPC transport and ``pull_models`` (kept channel, new channel), interleaved; the gRPC
    peer in a process of its own (``separate``, as another node is) or in this one (its event loop then shares
    our GIL)."""
    compile_decoder()  # as a daemon does at start
    weights, spec = model_and_spec(name)
    masks = masks_for(weights, density)
    frames = [
        m.SerializeToString()
        for m in encode_model(spec, weights, masks, value_type=value_type, **header_kwargs(density))
    ]
    with serving(name, density, value_type, separate, malloc) as port:
        peer = PeerAddress("bench-node", "127.0.0.1", port)
        raw, transport, full, fresh = [], [], [], []
        for _ in range(WARMUP + repeats):  # interleaved so that machine load hits all four alike
            raw.append(_raw_socket_time(frames))
            seconds, size = _grpc_transport_time(port, spec)
            transport.append(seconds)
            full.append(_pull_time(peer, spec))  # on the channel the previous pull kept
            CHANNELS.close()
            fresh.append(_pull_time(peer, spec))  # on a new channel: a peer's first pull
        CHANNELS.close()  # before the peer stops: its goodbye would be logged by the kept channel
    first_pulls = full[:WARMUP]
    raw, transport, full, fresh = raw[WARMUP:], transport[WARMUP:], full[WARMUP:], fresh[WARMUP:]
    raw_s, transport_s, full_s = statistics.median(raw), statistics.median(transport), statistics.median(full)
    fresh_s = statistics.median(fresh)
    return {
        "model": name,
        "density": density,
        "value_type": value_type.name.lower(),
        "server": "separate process" if separate else "same process",
        "malloc": malloc,
        "wire_bytes": size,
        "raw_socket_s": raw_s,
        "grpc_transport_s": transport_s,
        "pull_models_s": full_s,
        "grpc_transport_over_raw": transport_s / raw_s,
        "pull_models_over_raw": full_s / raw_s,
        "pull_models_new_channel_s": fresh_s,
        "pull_models_new_channel_over_raw": fresh_s / raw_s,
        "repeats": repeats,
        "first_pulls_s": first_pulls,
    }


def _pull_rows(names: list[str], repeats: int, modes: tuple[bool, ...], malloc: str, conn: Connection) -> None:
    """Every pull row in a process of its own: the allocator's settings are process-wide."""
    _apply_malloc(malloc)
    conn.send(
        [
            pull_speed(repeats, name, 0.5, vt, separate, malloc)
            for name in names
            for vt in (ValueType.FLOAT32, ValueType.FLOAT16)
            for separate in modes
        ]
    )


def pull_rows(names: list[str], repeats: int, modes: tuple[bool, ...], malloc: str) -> list[dict]:
    with _child(_pull_rows, names, repeats, modes, malloc) as conn:
        return _receive(conn, 1800, "the pull rows did not finish")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--quick", action="store_true", help="cnn only, fewer repeats (a CI smoke run)")
    parser.add_argument("--repeats", type=int, default=15, help="timed repeats (medians; 15 keep the ratio stable)")
    parser.add_argument(
        "--server", choices=("separate", "same", "both"), default="both",
        help="the gRPC peer of the pull rows: in a process of its own (as another node is), in this one, or both",
    )  # fmt: skip
    parser.add_argument(
        "--malloc", choices=("daemon", "default", "both"), default="both",
        help="glibc's allocator in the pull rows' processes: as `edge-node start` sets it, glibc's own, or both",
    )  # fmt: skip
    args = parser.parse_args(argv)
    names = ["cnn"] if args.quick else ["cnn", "resnet18"]
    repeats = 1 if args.quick else args.repeats

    rows = bytes_table(names, (0.5,) if args.quick else DENSITIES)
    print(f"{'model':9} {'d':>4} {'ours fp32':>12} {'ours fp16':>12} {'dense fp32':>12} {'COO u32+f32':>12}"
          f" {'floor':>12} {'floor/tensor':>12} {'ours/floor':>10} {'vs bm+vals':>10}")  # fmt: skip
    for r in rows:
        print(
            f"{r['model']:9} {r['density']:4.1f} {r['ours_fp32']:12,d} {r['ours_fp16']:12,d} {r['dense_fp32']:12,d}"
            f" {r['coo_u32_fp32']:12,d} {r['floor_bits_plus_fp32']:12,.0f}"
            f" {r['floor_per_tensor_plus_fp32']:12,.0f} {r['ours_fp32'] / r['floor_per_tensor_plus_fp32']:10.4f}"
            f" {r['overhead_vs_bitmap_plus_values_pct']:+9.3f}%"
        )
    speed = [codec_speed(n, 0.5, max(repeats, 3)) for n in names]
    print("\ncodec on 1 CPU thread, d = 0.5 (MB of wire bytes per second; best of repeats)")
    for s in speed:
        for key in ("float32", "float16"):
            print(
                f"{s['model']:9} {key:8} encode {s[f'{key}_encode_MBps']:7.1f} MB/s ({s[f'{key}_encode_s']:.3f} s)"
                f"  decode {s[f'{key}_decode_MBps']:7.1f} MB/s ({s[f'{key}_decode_s']:.3f} s)"
                f"  encode+decode {s[f'{key}_encode_plus_decode_s']:.3f} s"
            )
    modes = {"separate": (True,), "same": (False,), "both": (True, False)}[args.server]
    mallocs = {"daemon": ("daemon",), "default": ("default",), "both": ("default", "daemon")}[args.malloc]
    pulls = [pull for malloc in mallocs for pull in pull_rows(names, repeats, modes, malloc)]
    print(
        f"\nloopback pulls, d = 0.5, median of {repeats} after {WARMUP} untimed (each row: the four measured"
        " interleaved, one run)"
    )
    for pull in pulls:
        print(
            f"{pull['model']:9} {pull['value_type']:8} {pull['wire_bytes']:12,d} bytes, malloc {pull['malloc']:7},"
            f" peer in {pull['server']}:"
            f" raw TCP {pull['raw_socket_s'] * 1e3:7.1f} ms, gRPC transport {pull['grpc_transport_s'] * 1e3:7.1f} ms"
            f" ({pull['grpc_transport_over_raw']:.2f}x), pull_models incl. validation+decode"
            f" {pull['pull_models_s'] * 1e3:7.1f} ms ({pull['pull_models_over_raw']:.2f}x), on a new channel"
            f" {pull['pull_models_new_channel_s'] * 1e3:7.1f} ms ({pull['pull_models_new_channel_over_raw']:.2f}x);"
            f" untimed first pulls {' / '.join(f'{t * 1e3:.0f}' for t in pull['first_pulls_s'])} ms"
        )
    if args.json:
        meta = {"python": platform.python_version(), "torch": torch.__version__, "grpc": grpc.__version__,
                "machine": platform.machine(), "cpus": torch.get_num_threads()}  # fmt: skip
        args.json.write_text(json.dumps({"meta": meta, "bytes": rows, "codec": speed, "pull": pulls}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
