"""Generates the lair.v1 Python modules from proto/lair/v1/lair.proto.

`python -m lair_client.codegen [OUT_DIR]` writes lair/v1/lair_pb2.py and
lair_pb2_grpc.py under OUT_DIR (default: lair_client/_generated). The proto
is found through $LAIR_PROTO_DIR, else in the LAIR checkout this package
sits in (clients/python/lair_client -> proto/).
"""

import importlib
import os
import sys
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent
DEFAULT_OUT = _PACKAGE_DIR / "_generated"


def proto_dir() -> Path:
    env = os.environ.get("LAIR_PROTO_DIR")
    candidate = Path(env) if env else _PACKAGE_DIR.parents[2] / "proto"
    if not (candidate / "lair" / "v1" / "lair.proto").is_file():
        raise FileNotFoundError(
            f"lair/v1/lair.proto not found under {candidate}; set LAIR_PROTO_DIR to the repository's proto/ folder")
    return candidate


def generate(out_dir: Path = DEFAULT_OUT) -> Path:
    """Runs protoc (from grpcio-tools) into out_dir and returns it."""
    from grpc_tools import protoc  # imported here: only generation needs grpcio-tools

    source = proto_dir()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rc = protoc.main([
        "protoc", f"-I{source}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
        str(source / "lair" / "v1" / "lair.proto"),
    ])
    if rc != 0:
        raise RuntimeError(f"protoc failed with status {rc}")
    for package in (out_dir / "lair", out_dir / "lair" / "v1"):
        (package / "__init__.py").touch()
    return out_dir


def load_stubs(out_dir: Path = DEFAULT_OUT):
    """Returns (lair_pb2, lair_pb2_grpc), generating them first if needed."""
    out_dir = Path(out_dir)
    if not (out_dir / "lair" / "v1" / "lair_pb2_grpc.py").is_file():
        generate(out_dir)
    if str(out_dir) not in sys.path:
        sys.path.insert(0, str(out_dir))  # the generated code imports `lair.v1.lair_pb2`
    return (importlib.import_module("lair.v1.lair_pb2"), importlib.import_module("lair.v1.lair_pb2_grpc"))


if __name__ == "__main__":
    print(generate(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT))
