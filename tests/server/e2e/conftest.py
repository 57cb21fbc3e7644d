"""Starts a LAIR server on loopback for the end-to-end tests.

LAIR_E2E_TARGET selects it:
  fake  $LAIR_FAKE_SERVER: the real HTTP/gRPC front ends over a fake engine;
  real  `$LAIR_BIN serve` on a tiny GLA model made by `lair init --preset tiny
        --family gla --out DIR` (its folder must hold a tokenizer, see
        tokenizer/byte_tokenizer_writer.h), or on $LAIR_E2E_MODEL when set (a
        folder holding a model and its tokenizer).
Tests skip with a message when the Python packages or the binaries are
missing. Every wait below is bounded.
"""

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

openai = pytest.importorskip("openai", reason="pip install openai (the e2e tests drive the server with it)")
grpc = pytest.importorskip("grpc", reason="pip install grpcio grpcio-tools (for the gRPC e2e tests)")
pytest.importorskip("grpc_tools", reason="pip install grpcio-tools (generates the gRPC stubs)")

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "clients" / "python"))
from lair_client import LairClient  # noqa: E402

API_KEY = "test-key"
MAX_PROMPT_TOKENS = 256
TARGET = os.environ.get("LAIR_E2E_TARGET", "fake")


@dataclass
class ServerHandle:
    process: subprocess.Popen
    http_port: int
    grpc_port: int
    model: str
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def get(self, path: str) -> str:
        with urllib.request.urlopen(self.base_url + path, timeout=10) as response:
            return response.read().decode()

    def metric(self, name: str) -> float:
        for line in self.get("/metrics").splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        raise KeyError(name)

    def wait_idle(self, timeout: float = 20.0) -> None:
        """Waits until no request runs, waits, or holds a state slot."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.metric("lair_requests_running") == 0 and self.metric("lair_requests_waiting") == 0
                    and self.metric("lair_state_slots_used") == 0):
                return
            time.sleep(0.05)
        raise AssertionError("the server did not become idle:\n" + self.get("/metrics"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _real_model_dir(tmp: Path) -> Path:
    lair = os.environ.get("LAIR_BIN", "")
    if not lair or not os.access(lair, os.X_OK):
        pytest.skip(f"LAIR_BIN ({lair!r}) is not an executable lair binary")
    if os.environ.get("LAIR_E2E_MODEL"):
        return Path(os.environ["LAIR_E2E_MODEL"])
    model = tmp / "gla-tiny"
    init = subprocess.run([lair, "init", "--preset", "tiny", "--family", "gla", "--byte-tokenizer",
                           "--seed", "1", "--out", str(model)],
                          capture_output=True, text=True, timeout=300)
    assert init.returncode == 0, f"`lair init` failed: {init.stderr.strip()[:300]}"
    assert (model / "tokenizer.json").is_file(), "`lair init --byte-tokenizer` wrote no tokenizer.json"
    return model


def start_server(tmp: Path, extra_args=()) -> ServerHandle:
    http_port, grpc_port = _free_port(), _free_port()
    common = ["--http-port", str(http_port), "--grpc-port", str(grpc_port), "--api-key", API_KEY,
              "--max-prompt-tokens", str(MAX_PROMPT_TOKENS), *extra_args]
    if TARGET == "fake":
        binary = os.environ.get("LAIR_FAKE_SERVER", "")
        if not binary or not os.access(binary, os.X_OK):
            pytest.skip(f"LAIR_FAKE_SERVER ({binary!r}) is not built")
        command, model = [binary, "--served-model-name", "tiny", *common], "tiny"
    else:
        model_dir = _real_model_dir(tmp)
        command = [os.environ["LAIR_BIN"], "serve", "--model", str(model_dir), "--host", "127.0.0.1",
                   "--served-model-name", "tiny", *common]
        model = "tiny"
    log = tmp / f"server-{http_port}.log"
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    handle = ServerHandle(process, http_port, grpc_port, model, log)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited with {process.returncode}:\n{log.read_text()}")
        try:
            if '"ok"' in handle.get("/health"):
                return handle
        except OSError:
            time.sleep(0.1)
    stop_server(handle)
    raise AssertionError(f"the server did not answer /health within 120 s:\n{log.read_text()}")


def stop_server(handle: ServerHandle, timeout: float = 60.0) -> int:
    if handle.process.poll() is None:
        handle.process.send_signal(signal.SIGTERM)
        try:
            handle.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            handle.process.kill()
            handle.process.wait(timeout=10)
    return handle.process.returncode


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    handle = start_server(tmp_path_factory.mktemp("lair"))
    yield handle
    stop_server(handle)


@pytest.fixture(scope="session")
def client(server):
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def grpc_client(server):
    c = LairClient(server.grpc_target, api_key=API_KEY, timeout=60)
    yield c
    c.close()
