"""Transport benchmark: a large delta exchange over the gRPC stream versus a plain TCP socket copy.

Throughput (loopback): an fp32 payload of --mb MiB each way through ExchangeDeltas to a server in another process (as
gossip sends it: 1 MiB chunks, framing and sha256 checked) against as many bytes over one TCP socket; every path once
per round, --repeats rounds after a warm-up. Codecs: wire bytes, L2 error and seconds of each codec on a trained block
delta (a Gaussian one without --data-dir). Writes --out (JSON) and --md (a markdown fragment).

    python benchmarks/transport.py --data-dir /work/shared/data/wikitext-2
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing as mp
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path

import grpc
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import options, results
from swarmd.averaging.delta import decode, encode, shapes_of
from swarmd.protocol import Codec
from swarmd.transport import PeerClient, start_server
from swarmd.transport.framing import Encoded
from swarmd.v1 import swarm_pb2 as pb

META = dict(swarm_id="bench", config_hash="bench", kind="block_delta", block_index=1)
MIB = 1 << 20

NOTES = (  # the fragment's closing paragraph
    "Notes: wire bytes count the zstd payload plus the serialized header. The int8 row is the default encoder (step "
    "max(absmax/127, rms/4) per row); the absmax/127 row is the same format at the finest step. Beyond TCP's two "
    "kernel copies, gRPC frames, copies, hashes (sha256) and joins each chunk, plus HTTP/2 framing and flow control."
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = options.parser(__doc__, holds="train.txt for the trained block delta")
    p.add_argument("--mb", type=int, default=64, help="payload size each way, MiB of fp32 (default 64)")
    p.add_argument("--zstd", choices=["off", "on", "both"], default="both", help="zstd on the gRPC payload")
    p.add_argument("--repeats", type=int, default=3, help="timed exchanges per variant (default 3)")
    p.add_argument("--train-steps", type=int, default=30, help="BlockTrainer steps behind the realistic delta")
    options.add_outputs(p, "transport.json", "transport.md")
    return p.parse_args(argv)


def gaussian_payload(mb: int, zstd: bool, seed: int) -> Encoded:
    t = torch.randn(mb * MIB // 4, generator=torch.Generator().manual_seed(seed)) * 1e-3
    enc = encode({"delta": t}, "fp32", **META, zstd=zstd)
    enc.sha256()  # computed once up front, as a daemon does when it encodes its delta
    return enc


def fresh_copy(enc: Encoded) -> Encoded:
    """The same payload as a new Encoded (sha256 known, no frames cached): what a daemon sends the first time."""
    out = Encoded(enc.header, enc.payload)
    out._sha256 = enc.sha256()
    return out


class _ReplyHandler:
    """The server's side: GetStatus (the client dials with it) and ExchangeDeltas, answered with `reply`."""

    def __init__(self, reply: Encoded, cached: bool):
        self.reply, self.cached = reply, cached

    def status(self):
        return pb.PeerStatus(peer_id="bench-server")

    async def exchange(self, incoming: Encoded) -> Encoded:
        return self.reply if self.cached else fresh_copy(self.reply)


def _grpc_server_main(mb: int, zstd: bool, cached: bool, conn) -> None:
    async def main():
        reply = _ReplyHandler(gaussian_payload(mb, zstd, seed=1), cached)
        server = await start_server(reply, max_payload_bytes=2 * mb * MIB)
        conn.send(server.port)
        await asyncio.to_thread(conn.recv)  # any message means stop
        await server.stop(1)

    asyncio.run(main())


def _spawn(target, *args) -> tuple[mp.Process, object, int]:
    """Start a server process; returns it, our pipe end and the port it reports."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(*args, child), daemon=True)
    proc.start()
    if not parent.poll(120):
        proc.terminate()
        raise RuntimeError(f"benchmark server {target.__name__} did not start within 120 s")
    return proc, parent, parent.recv()


def _recv_exactly(sock: socket.socket, n: int) -> bytearray:
    buf, got = bytearray(n), 0
    view = memoryview(buf)
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 4 * MIB))
        if k == 0:
            raise ConnectionError("peer closed early")
        got += k
    return buf


def _tcp_server_main(nbytes: int, count: int, conn) -> None:
    data = os.urandom(nbytes)
    with socket.create_server(("127.0.0.1", 0)) as srv:
        conn.send(srv.getsockname()[1])
        for _ in range(count):
            peer, _ = srv.accept()
            with peer:
                _recv_exactly(peer, nbytes)
                peer.sendall(data)


def tcp_copy(port: int, data: bytes) -> float:
    """Seconds to send data over a fresh loopback connection and receive as many bytes back."""
    start = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(data)
        _recv_exactly(s, len(data))
    return time.perf_counter() - start


def cpu_s(*pids: int) -> float:
    """User + system CPU seconds so far of these processes, all their threads (Linux /proc)."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


async def grpc_runs(client: PeerClient, mb: int, zstd_variants: list[bool], procs: list) -> dict:
    """name -> (async () -> (seconds, CPU s, bytes moved), the row's extra keys) of every gRPC path, each against a
    server process of its own (appended to procs): fresh payloads per zstd variant, and (zstd off) a repeat send."""
    runs = {}
    for zstd, cached in [(z, False) for z in zstd_variants] + [(False, True)] * (False in zstd_variants):
        proc, pipe, port = _spawn(_grpc_server_main, mb, zstd, cached)
        procs.append((proc, pipe))
        name = f"gRPC ExchangeDeltas (fp32, zstd {'on' if zstd else 'off'}{', repeat send' if cached else ''})"
        payload, address = gaussian_payload(mb, zstd, seed=0), f"127.0.0.1:{port}"
        await client.status(address, timeout_s=60)  # dial the channel

        async def run(address=address, payload=payload, cached=cached, pid=proc.pid):
            outgoing = payload if cached else fresh_copy(payload)
            cpu0, start = cpu_s(os.getpid(), pid), time.perf_counter()
            reply = await client.exchange(address, outgoing, timeout_s=300)
            seconds, cpu = time.perf_counter() - start, cpu_s(os.getpid(), pid) - cpu0
            assert reply.raw_bytes == payload.raw_bytes
            return seconds, cpu, payload.header.payload_bytes + reply.header.payload_bytes

        extra = dict(payload_bytes=payload.header.payload_bytes, raw_bytes=payload.raw_bytes, zstd=zstd)
        runs[name] = (run, extra | {"frames_cached": cached})
    return runs


def summary(times: list[float], cpus: list[float], moved: int, tcp_times: list[float], tcp_moved: int) -> dict:
    """One path's row: best and median MB/s, its per-round ratios to TCP (paired: the same load), CPU s per GB."""
    best, median = min(times), statistics.median(times)
    out = dict(seconds=times, best_s=best, median_s=median, mb_per_s_best=moved / best / 1e6)
    per_round = [(moved / a) / (tcp_moved / b) for a, b in zip(times, tcp_times)]
    out |= dict(mb_per_s_median=moved / median / 1e6, bytes_moved=moved, ratio_to_tcp_per_round=per_round)
    out |= dict(ratio_to_tcp_median=statistics.median(per_round), cpu_s=cpus)
    return out | dict(cpu_s_per_gb_median=statistics.median(cpus) / (moved / 1e9))


async def bench_throughput(mb: int, zstd_variants: list[bool], repeats: int) -> dict:
    """Every path once per round, in turn, so all see the same background load; besides the wall time, the CPU
    seconds of both processes (all threads), which other jobs on the machine disturb much less."""
    procs: list = []
    client = PeerClient(max_payload_bytes=2 * mb * MIB)
    try:
        runs = await grpc_runs(client, mb, zstd_variants, procs)
        data = os.urandom(mb * MIB)
        proc, pipe, tcp_port = _spawn(_tcp_server_main, len(data), repeats + 1)
        procs.append((proc, pipe))

        async def tcp_run():
            cpu0 = cpu_s(os.getpid(), proc.pid)
            seconds = tcp_copy(tcp_port, data)
            return seconds, cpu_s(os.getpid(), proc.pid) - cpu0, 2 * len(data)

        runs["tcp"] = (tcp_run, {"payload_bytes": len(data)})
        times: dict[str, list[float]] = {name: [] for name in runs}
        cpus: dict[str, list[float]] = {name: [] for name in runs}
        moved: dict[str, int] = {}
        for i in range(repeats + 1):  # round 0 warms allocators and flow-control windows
            for name, (run, _) in runs.items():
                seconds, cpu, moved[name] = await run()
                if i:
                    times[name].append(seconds)
                    cpus[name].append(cpu)
            if i:
                rates = (f"{n.split(' (')[-1].rstrip(')')} {moved[n] / times[n][-1] / 1e6:.0f} MB/s" for n in runs)
                print(f"  round {i}: " + ", ".join(rates))
        tcp = (times["tcp"], moved["tcp"])
        out = {name: summary(times[name], cpus[name], moved[name], *tcp) | extra for name, (_, extra) in runs.items()}
        for r in out.values():
            r["cpu_over_tcp"] = r["cpu_s_per_gb_median"] / out["tcp"]["cpu_s_per_gb_median"]
        return out
    finally:
        await client.close()
        for proc, pipe in procs:
            with contextlib.suppress(OSError):
                pipe.send("stop")
            proc.join(30)
            if proc.is_alive():
                proc.terminate()


def block_delta(data_dir: Path | None, steps: int) -> tuple[dict[str, torch.Tensor], str]:
    """(block 1's delta after `steps` BlockTrainer steps on data_dir's train.txt, else a Gaussian one; what it is)."""
    from swarmd.core.config import ModelConfig, TrainConfig
    from swarmd.core.data import ByteData
    from swarmd.core.train import BlockTrainer, init_block

    train_file = data_dir / "train.txt" if data_dir else None
    if train_file is None or not train_file.exists():
        g, block = torch.Generator().manual_seed(0), init_block(ModelConfig(), 1, 0).state_dict()
        how = "gaussian (no --data-dir): N(0, 1e-3) per element, shaped like a default block"
        return {k: torch.randn(v.shape, generator=g) * 1e-3 for k, v in block.items()}, how
    torch.manual_seed(0)
    trainer = BlockTrainer(ModelConfig(), TrainConfig(batch_size=16, warmup_steps=0), block_index=1)
    before = {k: v.detach().clone() for k, v in trainer.block.state_dict().items()}
    stream = ByteData.from_path(train_file, trainer.model_cfg.seq_len).stream(seed=0, batch_size=16)
    for _ in range(steps):
        trainer.step(*next(stream))
    after = trainer.block.state_dict()
    how = f"trained: block 1 of a default ModelConfig after {steps} BlockTrainer steps (batch 16, lr 1e-3, no warmup)"
    return {k: after[k].float() - before[k].float() for k in before}, f"{how} on {train_file}"


def bench_codecs(delta: dict[str, torch.Tensor]) -> dict:
    """Per codec (and int8 at its finest step): wire bytes with and without zstd, relative L2 error, seconds."""
    shapes, out = shapes_of(delta), {}
    l2 = lambda ts: torch.sqrt(sum((t.double() ** 2).sum() for t in ts)).item()
    norm = l2(delta.values())
    variants = [(c.value, c, {}) for c in Codec] + [("int8 (absmax/127 step)", "int8", {"int8_rms_levels": None})]
    for label, codec, kw in variants:
        start = time.perf_counter()
        enc = encode(delta, codec, **META, **kw)
        decoded = decode(enc, shapes, **META)
        seconds = time.perf_counter() - start
        plain = encode(delta, codec, **META, zstd=False, **kw)
        rel = l2(decoded[k].double() - delta[k].double() for k in delta) / norm if norm else 0.0
        raw, wire = enc.raw_bytes, enc.wire_bytes
        out[label] = dict(raw_bytes=raw, wire_bytes=wire, wire_over_raw=wire / raw, wire_bytes_no_zstd=plain.wire_bytes)
        out[label] |= dict(wire_over_raw_no_zstd=plain.wire_bytes / plain.raw_bytes, relative_l2_error=rel)
        out[label]["encode_decode_s"] = seconds
    return out


def markdown(result: dict) -> str:
    tp, cod, head = result["throughput"], result["codecs"], result["headline"]
    path_head = (
        "path | bytes on the wire each way | best MB/s | median MB/s | ratio to TCP (best / best) "
        "| ratio to TCP (median of rounds) | CPU s/GB | CPU / TCP's"
    )
    paths = [
        f"{name} | {r['payload_bytes']:,} | {r['mb_per_s_best']:.0f} | {r['mb_per_s_median']:.0f} "
        f"| {r['mb_per_s_best'] / tp['tcp']['mb_per_s_best']:.2f} | {r['ratio_to_tcp_median']:.2f} "
        f"| {r['cpu_s_per_gb_median']:.2f} | {r['cpu_over_tcp']:.2f}"
        for name, r in tp.items()
    ]
    codecs = [
        f"{codec} | {r['wire_bytes']:,} | {r['wire_over_raw']:.3f} | {r['wire_over_raw_no_zstd']:.3f} "
        f"| {r['relative_l2_error']:.2e} | {r['encode_decode_s']:.3f}"
        for codec, r in cod.items()
    ]
    codec_head = "codec | wire bytes (zstd) | wire / raw fp32 | without zstd | relative L2 error | encode+decode s"
    lines = results.paragraphs(
        "### Transport: gRPC delta exchange vs plain TCP (loopback)",
        f"**gRPC / TCP bytes per second: {head['grpc_over_tcp']:.2f}x** ({head['path']}, median of per-round "
        f"ratios; target >= 0.7x). Load average while it ran: {result['load_average']}.",
        f"Command: `{result['command']}`",
        f"{result['payload_mib']} MiB of fp32 payload each way (Gaussian values), server in another process, best / "
        f"median of {result['repeats']} rounds after a warm-up round (every path once per round, in turn); MB/s = "
        "payload bytes moved both ways / wall time. The `repeat send` row sends a payload whose frames are cached (a "
        "daemon's delta to its second and later peers). CPU s/GB: CPU seconds of both processes per GB moved.",
        results.table(path_head, paths),
        f"### Wire bytes per codec for one block delta ({result['delta_source']})",
        f"Raw fp32 size: {next(iter(cod.values()))['raw_bytes']:,} bytes.",
        results.table(codec_head, codecs),
    )
    return "\n".join([*lines, NOTES, *results.machine_footer(result["machine"])])


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    sys.stdout.reconfigure(line_buffering=True)  # progress lines show as they come
    variants = {"off": [False], "on": [True], "both": [False, True]}[args.zstd]
    print(f"gRPC exchange vs TCP copy, {args.mb} MiB each way, {args.repeats} rounds ...")
    throughput = asyncio.run(bench_throughput(args.mb, variants, args.repeats))
    grpc_paths = [k for k in throughput if k != "tcp"]
    ratios = ", ".join(f"{k}: {throughput[k]['ratio_to_tcp_median']:.2f}" for k in grpc_paths)
    print(f"ratio gRPC/TCP (median of rounds): {ratios}\ncodecs on a block delta ...")
    delta, source = block_delta(args.data_dir, args.train_steps)
    first, tcp_best = grpc_paths[0], throughput["tcp"]["mb_per_s_best"]
    result = {
        "headline": {"path": first, "grpc_over_tcp": throughput[first]["ratio_to_tcp_median"]},
        "load_average": " / ".join(f"{x:.1f}" for x in os.getloadavg()),
        "command": results.command_line("transport.py", argv),
        "payload_mib": args.mb,
        "repeats": args.repeats,
        "throughput": throughput,
        "grpc_over_tcp_best": {k: throughput[k]["mb_per_s_best"] / tcp_best for k in grpc_paths},
        "delta_source": source,
        "codecs": bench_codecs(delta),
        "machine": (
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs visible, "
            f"Python {platform.python_version()}, grpcio {grpc.__version__}, torch {torch.__version__}"
        ),
    }
    results.write_json(args.out, result, sort_keys=False)
    results.write_text(args.md, markdown(result))
    print(markdown(result))
    return result


if __name__ == "__main__":
    main()
