"""The committed swarmd/v1 stubs are exactly what proto/gen.py generates from the .proto."""

from __future__ import annotations

import importlib.util
from pathlib import Path

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
    }
