"""Regenerate the committed gRPC stubs: python proto/gen.py [OUT_DIR] (default: repository root).

Runs grpc_tools.protoc -I proto --python_out --grpc_python_out --pyi_out over proto/swarmd/v1,
which writes swarmd/v1/swarm_pb2{,_grpc}.py{,i}. tests/test_protos.py regenerates into a temp
directory and compares bytes, so committed stubs never drift from the .proto.
"""

from __future__ import annotations

import sys
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = sorted((ROOT / "proto" / "swarmd" / "v1").glob("*.proto"))


def generate(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    include = str(Path(protoc.__file__).parent / "_proto")
    args = [
        "protoc",
        f"-I{ROOT / 'proto'}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--pyi_out={out_dir}",
    ]
    rc = protoc.main(args + [str(p) for p in PROTOS])
    if rc != 0:
        raise SystemExit(f"protoc failed with exit code {rc}")


if __name__ == "__main__":
    generate(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
