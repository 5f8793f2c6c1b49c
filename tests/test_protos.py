"""The committed swarmd/v1 stubs are exactly what proto/gen.py generates from the .proto."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def load_gen():
    spec = importlib.util.spec_from_file_location("proto_gen", ROOT / "proto" / "gen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_stubs_match_the_proto(tmp_path):
    load_gen().generate(tmp_path)
    generated = sorted(p.relative_to(tmp_path) for p in (tmp_path / "swarmd" / "v1").iterdir() if p.is_file())
    assert [p.name for p in generated] == ["swarm_pb2.py", "swarm_pb2.pyi", "swarm_pb2_grpc.py"]
    for rel in generated:
        committed = ROOT / rel
        assert committed.read_bytes() == (tmp_path / rel).read_bytes(), f"{rel} is stale: run python proto/gen.py"


def test_service_shape():
    from swarmd.v1 import swarm_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["Swarm"]
    assert pb.DESCRIPTOR.package == "swarmd.v1" and service.full_name == "swarmd.v1.Swarm"
    methods = {m.name: (m.client_streaming, m.server_streaming) for m in service.methods}
    assert methods == {
        "GetStatus": (False, False),
        "GetConfig": (False, False),
        "PullState": (False, True),
        "ExchangeDeltas": (True, True),
        "Forward": (True, True),
        "DialBack": (False, False),
    }


def test_python_enums_mirror_the_proto_enums():
    from swarmd.protocol import PROTOCOL, Codec, PayloadKind, PeerState
    from swarmd.v1 import swarm_pb2 as pb

    assert PROTOCOL == "swarmd.v1"
    for enum, prefix in ((Codec, "CODEC_"), (PayloadKind, "PAYLOAD_KIND_"), (PeerState, "PEER_STATE_")):
        proto_names = [v.name.removeprefix(prefix) for v in getattr(pb, enum.__name__).DESCRIPTOR.values]
        assert proto_names == ["UNSPECIFIED", *enum.__members__], enum
        for member in enum:
            assert enum.from_pb(member.to_pb()) is member and member == member.value
        with pytest.raises(ValueError):
            enum.from_pb(0)  # UNSPECIFIED is no member
    assert [k.part for k in PayloadKind] == ["block", "embedding", "block", "embedding"]
    assert PayloadKind.BLOCK_DELTA.state is PayloadKind.BLOCK_STATE
    assert PayloadKind.EMBEDDING_STATE.delta is PayloadKind.EMBEDDING_DELTA


def test_tensor_spec_scales_is_reserved_and_status_carries_both_hashes():
    from swarmd.v1 import swarm_pb2 as pb

    assert "scales" not in pb.TensorSpec.DESCRIPTOR.fields_by_name
    st = pb.PeerStatus(base_hash="b", emb_hash="e")
    assert (st.base_hash, st.emb_hash) == ("b", "e")


def test_reachability_is_new_fields_and_a_new_rpc_beside_the_old_ones():
    """The dial-back check added PeerStatus fields 26-27 and DialBack; no existing field moved."""
    from swarmd.v1 import swarm_pb2 as pb

    fields = pb.PeerStatus.DESCRIPTOR.fields_by_name
    assert fields["signed_record"].number == 25 and fields["reachability"].number == 26
    assert fields["reachability_detail"].number == 27
    assert [v.name for v in pb.Reachability.DESCRIPTOR.values] == [
        "REACHABILITY_UNKNOWN",
        "REACHABILITY_REACHABLE",
        "REACHABILITY_UNREACHABLE",
    ]
    assert pb.PeerStatus().reachability == pb.REACHABILITY_UNKNOWN  # an older peer's status reads as unknown
    request = pb.DialBackRequest.DESCRIPTOR.fields_by_name
    assert [(n, request[n].number) for n in ("port", "peer_id", "tls_fingerprint")] == [
        ("port", 1),
        ("peer_id", 2),
        ("tls_fingerprint", 3),
    ]
