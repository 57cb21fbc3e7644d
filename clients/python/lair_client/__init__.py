"""Python client for LAIR's gRPC API (proto/lair/v1/lair.proto).

The message and stub modules are generated from the .proto with grpcio-tools
(see codegen.py) the first time they are needed.
"""

from lair_client.client import LairClient
from lair_client.codegen import load_stubs

__all__ = ["LairClient", "load_stubs"]
