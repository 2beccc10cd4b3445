"""Generates tfplaceto/protos/*_pb2.py from protos/*.proto with grpcio-tools.

Run `make protos` after editing a .proto; tests/test_protos.py fails while a generated module is
out of date. grpcio-tools 1.62 emits code for protobuf 4.25, the release TensorFlow 2.15 pins.
"""

import pathlib
import sys

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "protos"
OUT_DIR = ROOT / "tfplaceto" / "protos"


def generate(out_dir: pathlib.Path = OUT_DIR) -> list[pathlib.Path]:
    """Compiles every .proto under protos/ into out_dir; returns the generated files."""
    out_dir.mkdir(parents=True, exist_ok=True)
    protos = sorted(PROTO_DIR.glob("*.proto"))
    args = ["protoc", f"-I{PROTO_DIR}", f"--python_out={out_dir}"] + [str(p) for p in protos]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    return [out_dir / (p.stem + "_pb2.py") for p in protos]


if __name__ == "__main__":
    for path in generate(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else OUT_DIR):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
