"""Transport benchmark: a large delta exchange over the gRPC stream versus a plain TCP socket copy.

Part 1 (throughput, loopback): a client streams a pre-encoded fp32 payload of --mb MiB (zstd off and/or on) to a
swarmd.v1 server in another process, which answers each ExchangeDeltas with a payload of the same size, as gossip
does (1 MiB chunks, framing and sha256 checked on both sides); the baseline copies as many bytes each way over one
plain TCP socket. Each round runs every path once, in turn (the same background load); MB/s = 2 x payload / wall
time of one exchange; best and median of --repeats rounds after a warm-up, and the ratio gRPC/TCP.

Part 2 (codecs): wire bytes per codec against raw fp32, relative L2 error and encode+decode time, for block 1 of a
default ModelConfig trained --train-steps BlockTrainer steps on --data-dir (default $BLOCKTRAIN_DATA; without data,
a Gaussian delta, and the output says so).

Writes --out (JSON) and --md (a markdown fragment with the table and the command).

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
    "max(absmax/127, rms/4) per row: zstd packs a value into ~4.2 bits; ErrorFeedback carries its error into the "
    "next round); the absmax/127 row is the same format at the finest step (int8_rms_levels=None). Beyond TCP's two "
    "kernel copies, gRPC costs: the sender frames each chunk once (none on a repeat send) and grpc copies it into its "
    "slices; the receiver gets each message as bytes (one copy), keeps a view of the chunk, hashes it on a helper "
    "thread (sha256 of the payload, for its signature) and joins the chunks once; plus HTTP/2 framing and flow "
    "control. Two processes on 2 CPUs shared with other jobs: figures vary run to run."
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
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(mb * MIB // 4, generator=g) * 1e-3
    enc = encode({"delta": t}, "fp32", **META, zstd=zstd)
    enc.sha256()  # computed once up front, as a daemon does when it encodes its delta
    return enc


def fresh_copy(enc: Encoded) -> Encoded:
    """The same payload as a new Encoded (sha256 known, no frames cached): what a daemon sends the first time."""
    out = Encoded(enc.header, enc.payload)
    out._sha256 = enc.sha256()
    return out


class _ReplyHandler:
    def __init__(self, reply: Encoded, cached: bool):
        self.reply, self.cached = reply, cached

    def status(self):
        return pb.PeerStatus(peer_id="bench-server")

    def swarm_config(self):
        return pb.SwarmConfig(swarm_id="bench")

    async def exchange(self, incoming: Encoded) -> Encoded:
        return self.reply if self.cached else fresh_copy(self.reply)

    pull_state = exchange

    async def forward(self, request):
        raise NotImplementedError


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


async def bench_throughput(mb: int, zstd_variants: list[bool], repeats: int) -> dict:
    """Every variant once per repeat, round-robin, so all see the same background load.

    Besides wall time, each run's CPU seconds of both processes (client and server, all threads) are
    recorded: a figure that other jobs on the machine disturb much less than the wall time.
    """
    procs, runs = [], {}  # runs: name -> (async () -> (seconds, cpu s, bytes moved), the row's extra keys)
    client = PeerClient(max_payload_bytes=2 * mb * MIB)
    try:
        for zstd, cached in [(z, False) for z in zstd_variants] + [(False, True)] * (False in zstd_variants):
            proc, pipe, port = _spawn(_grpc_server_main, mb, zstd, cached)
            procs.append((proc, pipe))
            name = f"gRPC ExchangeDeltas (fp32, zstd {'on' if zstd else 'off'}{', repeat send' if cached else ''})"
            payload, address = gaussian_payload(mb, zstd, seed=0), f"127.0.0.1:{port}"
            await client.status(address, timeout_s=60)  # dial the channel

            async def grpc_run(address=address, payload=payload, cached=cached, pid=proc.pid):
                outgoing = payload if cached else fresh_copy(payload)
                cpu0, start = cpu_s(os.getpid(), pid), time.perf_counter()
                reply = await client.exchange(address, outgoing, timeout_s=300)
                seconds, cpu = time.perf_counter() - start, cpu_s(os.getpid(), pid) - cpu0
                assert reply.raw_bytes == payload.raw_bytes
                return seconds, cpu, payload.header.payload_bytes + reply.header.payload_bytes

            extra = dict(payload_bytes=payload.header.payload_bytes, raw_bytes=payload.raw_bytes, zstd=zstd)
            runs[name] = (grpc_run, extra | {"frames_cached": cached})
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
                print(f"  round {i}: " + ", ".join(rates), flush=True)
        out = {}
        for name, (_, extra) in runs.items():
            t, m = times[name], moved[name]
            best, median = min(t), statistics.median(t)
            out[name] = dict(seconds=t, best_s=best, median_s=median, mb_per_s_best=m / best / 1e6)
            out[name] |= dict(mb_per_s_median=m / median / 1e6, bytes_moved=m, **extra)
            per_round = [(m / a) / (moved["tcp"] / b) for a, b in zip(t, times["tcp"])]  # paired: same load
            out[name] |= dict(ratio_to_tcp_per_round=per_round, ratio_to_tcp_median=statistics.median(per_round))
            out[name] |= dict(cpu_s=cpus[name], cpu_s_per_gb_median=statistics.median(cpus[name]) / (m / 1e9))
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
    from swarmd.core.config import ModelConfig, TrainConfig
    from swarmd.core.data import ByteData
    from swarmd.core.train import BlockTrainer, init_block

    train_file = data_dir / "train.txt" if data_dir else None
    if train_file is None or not train_file.exists():
        g = torch.Generator().manual_seed(0)
        block = init_block(ModelConfig(), 1, 0).state_dict()
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
        err = l2(decoded[k].double() - delta[k].double() for k in delta)
        raw, wire, plain_wire = enc.raw_bytes, enc.wire_bytes, plain.wire_bytes
        rel = err / norm if norm else 0.0
        out[label] = dict(raw_bytes=raw, wire_bytes=wire, wire_over_raw=wire / raw, wire_bytes_no_zstd=plain_wire)
        out[label] |= dict(wire_over_raw_no_zstd=plain_wire / plain.raw_bytes, relative_l2_error=rel)
        out[label]["encode_decode_s"] = seconds
    return out


def markdown(result: dict) -> str:
    tp, cod, head = result["throughput"], result["codecs"], result["headline"]
    lines = [
        "### Transport: gRPC delta exchange vs plain TCP (loopback)",
        "",
        f"**gRPC / TCP bytes per second: {head['grpc_over_tcp']:.2f}x** ({head['path']}, median of per-round "
        f"ratios; target >= 0.7x). Load average while it ran: {result['load_average']}.",
        "",
        f"Command: `{result['command']}`",
        "",
        f"{result['payload_mib']} MiB of fp32 payload each way (Gaussian values), server in another process, best / "
        f"median of {result['repeats']} rounds after a warm-up round (each round runs every path once, in turn: the "
        "same background load); MB/s = payload bytes moved both ways / wall time. gRPC includes what gossip does "
        "per exchange: 1 MiB chunks, framing checks and sha256 on both sides. Each send is a payload sent for the "
        "first time (chunks framed anew) but in the `repeat send` row (frames cached: a daemon's delta sent to, or "
        "served to, its second and later peers). CPU s/GB: CPU seconds of both processes (all threads) per GB "
        "moved, median of rounds; other jobs disturb it less than the wall time.",
        "",
        "| path | bytes on the wire each way | best MB/s | median MB/s | ratio to TCP (best / best) "
        "| ratio to TCP (median of rounds) | CPU s/GB | CPU / TCP's |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {name} | {r['payload_bytes']:,} | {r['mb_per_s_best']:.0f} | {r['mb_per_s_median']:.0f} "
            f"| {r['mb_per_s_best'] / tp['tcp']['mb_per_s_best']:.2f} | {r['ratio_to_tcp_median']:.2f} "
            f"| {r['cpu_s_per_gb_median']:.2f} | {r['cpu_over_tcp']:.2f} |"
            for name, r in tp.items()
        ),
        "",
        f"### Wire bytes per codec for one block delta ({result['delta_source']})",
        "",
        f"Raw fp32 size: {next(iter(cod.values()))['raw_bytes']:,} bytes.",
        "",
        "| codec | wire bytes (zstd) | wire / raw fp32 | without zstd | relative L2 error | encode+decode s |",
        "|---|---:|---:|---:|---:|---:|",
        *(
            f"| {codec} | {r['wire_bytes']:,} | {r['wire_over_raw']:.3f} | {r['wire_over_raw_no_zstd']:.3f} "
            f"| {r['relative_l2_error']:.2e} | {r['encode_decode_s']:.3f} |"
            for codec, r in cod.items()
        ),
        "",
        NOTES,
        *results.machine_footer(result["machine"]),
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(1)
    variants = {"off": [False], "on": [True], "both": [False, True]}[args.zstd]
    print(f"gRPC exchange vs TCP copy, {args.mb} MiB each way, {args.repeats} rounds ...", flush=True)
    throughput = asyncio.run(bench_throughput(args.mb, variants, args.repeats))
    grpc_paths = [k for k in throughput if k != "tcp"]
    ratios = ", ".join(f"{k}: {throughput[k]['ratio_to_tcp_median']:.2f}" for k in grpc_paths)
    print(f"ratio gRPC/TCP (median of rounds): {ratios}", flush=True)
    print("codecs on a block delta ...", flush=True)
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
