"""What peer identity costs per round: signing and verifying payloads and records, the swarm key.

At benchmarks/swarm.py's config (3 blocks x 2 replicas, d_model 64, seq_len 64, batch 16, H=25, int8) on one thread:
a round's compute (H local steps of one block) against sign_payload / verify_payload of real deltas and an fp32 state,
sign_record / record_problem of a discovery record, the swarm key's proof per RPC, the re-sync hash of a pulled state,
and the bytes they add; then their sum over what one peer does per round. Writes --out and --md (trust_cost.md).

    python benchmarks/trust_cost.py
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import msgpack
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.harness import options, results
from swarmd.averaging.delta import ErrorFeedback, encode
from swarmd.averaging.state import BlockState, weights_hash
from swarmd.core.config import ModelConfig, TrainConfig
from swarmd.core.data import ByteData
from swarmd.core.train import BlockTrainer
from swarmd.membership.identity import Identity
from swarmd.membership.records import PeerRecord
from swarmd.membership.trust import record_problem, sign_payload, sign_record, verify_payload
from swarmd.protocol import Codec
from swarmd.transport.auth import AUTH_HEADER, ProofChecker, make_proof, new_swarm_key, parse_swarm_key

PEERS, BLOCKS, ANNOUNCE_PERIOD_S, H = 6, 3, 2.0, 25
OTHERS, SAME_BLOCK = PEERS - 1, PEERS // BLOCKS - 1  # the peers a peer exchanges with, those of its block


def timed(fn, n: int) -> float:
    """Median seconds of fn() over n runs (after one warm-up)."""
    fn()
    runs = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def payload_rows(cfg: ModelConfig, state: BlockState, me: Identity, repeats: int) -> list[dict]:
    """Bytes, signature bytes and sign / verify microseconds of a block delta, a byte-table delta and a block state."""
    block_delta, emb_delta = state.deltas()
    hdr = dict(swarm_id="bench", config_hash=cfg.config_hash(), round=7, peer_id=me.peer_id, weight=float(H))
    int8 = lambda delta, **kw: ErrorFeedback().compress(delta, Codec.INT8, **kw, **hdr)[0]
    payloads = {
        "block delta (int8)": int8(block_delta, kind="block_delta", block_index=1, base_hash=state.block_hash),
        "byte-table delta (int8)": int8(emb_delta, kind="embedding_delta", block_index=-1, base_hash=state.emb_hash),
        "block state (fp32)": encode(state.base_block, "fp32", kind="block_state", block_index=1, **hdr),
    }
    rows = []
    for name, enc in payloads.items():
        sign_payload(enc, me)
        row = {"payload": name, "payload_bytes": len(enc.payload)}
        row["signature_bytes"] = enc.header.ByteSize() - _unsigned_size(enc)
        row["sign_us"] = 1e6 * timed(lambda enc=enc: sign_payload(enc, me), repeats)
        rows.append(row | {"verify_us": 1e6 * timed(lambda enc=enc: verify_payload(enc), repeats)})
    return rows


def main(argv=None) -> None:
    p = options.parser(__doc__)
    p.add_argument("--repeats", type=int, default=200)
    options.add_outputs(p, "trust_cost.json", "trust_cost.md")
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    cfg = ModelConfig(blocks=BLOCKS, layers_per_block=1, d_model=64, n_heads=4, hidden=256, seq_len=64)
    state = BlockState(BlockTrainer(cfg, TrainConfig(batch_size=16, lr=3e-3, warmup_steps=0), 1, worker_seed=0))
    text = (Path(__file__).resolve().parent.parent / "README.md").read_bytes()
    batches = ByteData(torch.frombuffer(bytearray(text), dtype=torch.uint8).numpy(), cfg.seq_len).stream(0, 16)
    started = time.perf_counter()
    state.train_steps(H, batches)
    round_compute_s = time.perf_counter() - started
    me = Identity.generate()
    rows = payload_rows(cfg, state, me, a.repeats)
    out = {"command": results.command_line("trust_cost.py", argv), "machine": results.machine()}
    out["config"] = {"peers": PEERS, "blocks": BLOCKS, "d_model": 64, "seq_len": 64, "batch": 16, "H": H}
    out["config"]["codec"] = "int8"
    out |= {"round_compute_s": round_compute_s, "payloads": rows}
    record = PeerRecord(me.peer_id, "10.0.0.1:50051", 1, 7, 12.5, cfg.config_hash(), state.block_hash, False, "bench")
    record = record.__class__(**{**record.to_value(), "emb_hash": state.emb_hash})
    signed = sign_record(record, me, 15.0)
    unsigned = {k: v for k, v in record.to_value().items() if k not in ("expires", "signature", "tls_fingerprint")}
    out["record_bytes"] = {"unsigned": len(msgpack.packb(unsigned)), "signed": len(msgpack.packb(signed.to_value()))}
    out["record_sign_us"] = 1e6 * timed(lambda: sign_record(record, me, 15.0), a.repeats)
    out["record_verify_us"] = 1e6 * timed(lambda: record_problem(signed), a.repeats)
    key = parse_swarm_key(new_swarm_key())
    checker, method = ProofChecker(key), "/swarmd.v1.Swarm/ExchangeDeltas"
    proof_bytes = len(AUTH_HEADER) + len(make_proof(key, method))
    proof_us = 1e6 * timed(lambda: checker.problem(method, make_proof(key, method)), a.repeats)
    out |= {"swarm_key_proof_us": proof_us, "swarm_key_proof_bytes": proof_bytes}
    out["resync_hash_check_ms"] = 1e3 * timed(lambda: weights_hash(state.base_block), max(5, a.repeats // 20))

    blk, emb, wire_bytes = delta_rows(rows)
    announces = 1 + round_compute_s / ANNOUNCE_PERIOD_S
    per_round_us = blk["sign_us"] + emb["sign_us"] + SAME_BLOCK * blk["verify_us"] + OTHERS * emb["verify_us"]
    per_round_us += announces * out["record_sign_us"] + 2 * OTHERS * out["record_verify_us"] + 6 * proof_us
    sent_payloads = SAME_BLOCK + OTHERS  # each peer's deltas go to every peer that exchanges with it
    signed_extra = out["record_bytes"]["signed"] - out["record_bytes"]["unsigned"]  # x 2: stored under two keys
    per_round_bytes = sent_payloads * emb["signature_bytes"] + 2 * announces * signed_extra + 6 * proof_bytes
    per = {"seconds": 1e-6 * per_round_us, "fraction_of_round_compute": 1e-6 * per_round_us / round_compute_s}
    per |= {"bytes": per_round_bytes, "fraction_of_delta_bytes": per_round_bytes / wire_bytes}
    out["per_round_per_peer"] = per
    results.write_json(a.out, out)
    md = markdown(out)
    results.write_text(a.md, "\n".join(md))
    print("\n".join(md))


def delta_rows(rows: list[dict]) -> tuple[dict, dict, int]:
    """(the block delta's row, the byte-table delta's, the delta bytes a peer sends per round)."""
    by_name = {r["payload"]: r for r in rows}
    blk, emb = by_name["block delta (int8)"], by_name["byte-table delta (int8)"]
    return blk, emb, SAME_BLOCK * blk["payload_bytes"] + OTHERS * emb["payload_bytes"]


def markdown(out: dict) -> list[str]:
    """The trust_cost.md fragment of a result."""
    rows, record_bytes, per = out["payloads"], out["record_bytes"], out["per_round_per_peer"]
    table = [
        f"{r['payload']} | {r['payload_bytes']} | {r['signature_bytes']} | {r['sign_us']:.0f} | {r['verify_us']:.0f}"
        for r in rows
    ]
    return [
        "## Cost of peer identity, signatures and the swarm key (issue 9)",
        "",
        f"`{out['command']}` ({out['machine']}, one torch thread). Benchmark-swarm config: 6 peers = 3 blocks x 2"
        " replicas, d_model 64, seq_len 64, batch 16, H = 25, int8 deltas.",
        "",
        *results.table("payload | payload bytes | signature bytes | sign (us) | verify (us)", table, "lllll"),
        "",
        f"- discovery record: {record_bytes['unsigned']} -> {record_bytes['signed']} bytes (msgpack); sign"
        f" {out['record_sign_us']:.0f} us, verify {out['record_verify_us']:.0f} us (uncached; a record seen before is"
        " not re-verified)",
        f"- swarm key proof: {out['swarm_key_proof_bytes']} bytes of metadata per RPC, {out['swarm_key_proof_us']:.0f}"
        " us to make and check",
        f"- re-sync: hashing a pulled block state against the quorum's hash {out['resync_hash_check_ms']:.2f} ms (once"
        " per adoption)",
        f"- **per round and peer**: {1e3 * per['seconds']:.2f} ms = {100 * per['fraction_of_round_compute']:.2f} % of"
        f" the round's {out['round_compute_s']:.2f} s of local steps; {per['bytes']:.0f} bytes ="
        f" {100 * per['fraction_of_delta_bytes']:.2f} % of the {delta_rows(rows)[2]} delta bytes it sends",
        "",
    ]


def _unsigned_size(enc) -> int:
    header = enc.header.__class__()
    header.CopyFrom(enc.header)
    header.signature = b""
    return header.ByteSize()


if __name__ == "__main__":
    main()
