"""The lair.v1 gRPC API, driven by the generated Python stubs."""

import time

import grpc
import pytest

from conftest import API_KEY
from lair_client import LairClient


def test_generate_and_stream_agree(server, grpc_client):
    response = grpc_client.generate("Hello gRPC", max_tokens=10, temperature=0, ignore_eos=True, n=2)
    assert response.model == server.model
    assert [c.index for c in response.completions] == [0, 1]
    assert all(c.finish_reason == "length" and len(c.token_ids) == 10 for c in response.completions)
    assert response.usage.completion_tokens == 20
    texts = {0: "", 1: ""}
    finishes = {}
    for message in grpc_client.generate_stream("Hello gRPC", max_tokens=10, temperature=0, ignore_eos=True, n=2):
        texts[message.index] += message.text
        if message.finish_reason:
            finishes[message.index] = message.finish_reason
            assert message.usage.completion_tokens == 10
    assert texts == {c.index: c.text for c in response.completions}
    assert finishes == {0: "length", 1: "length"}


def test_token_prompt_logprobs_and_tokenizer(server, grpc_client):
    ids = list(grpc_client.tokenize("round trip", add_special_tokens=False).token_ids)
    assert grpc_client.detokenize(ids).text == "round trip"
    response = grpc_client.generate(ids, max_tokens=3, temperature=0, ignore_eos=True, logprobs=2)
    logprobs = response.completions[0].logprobs
    assert len(logprobs) == 3 and all(len(lp.top) == 2 for lp in logprobs)
    scored = grpc_client.generate(ids, max_tokens=2, temperature=0, ignore_eos=True, prompt_logprobs=1, n=2)
    for completion in scored.completions:
        assert [lp.token_id for lp in completion.prompt_logprobs] == ids[1:]
        assert all(lp.logprob <= 0 and len(lp.top) == 1 for lp in completion.prompt_logprobs)
    streamed = [m for m in grpc_client.generate_stream(ids, max_tokens=2, temperature=0, prompt_logprobs=0)
                if m.prompt_logprobs]
    assert len(streamed) == 1 and len(streamed[0].prompt_logprobs) == len(ids) - 1
    models = grpc_client.list_models().models
    assert [m.id for m in models] == [server.model] and models[0].vocab_size > 0


def test_errors_map_to_grpc_codes(server, grpc_client):
    pb2 = grpc_client.pb2
    with pytest.raises(grpc.RpcError) as error:
        grpc_client.stub.Generate(pb2.GenerateRequest(), metadata=grpc_client.metadata, timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as error:
        grpc_client.generate("x", model="nope", max_tokens=1)
    assert error.value.code() == grpc.StatusCode.NOT_FOUND
    with pytest.raises(grpc.RpcError) as error:
        grpc_client.generate("x", max_tokens=1, temperature=-1)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    bad = LairClient(server.grpc_target, api_key="wrong", timeout=10)
    with pytest.raises(grpc.RpcError) as error:
        bad.generate("x", max_tokens=1)
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as error:
        list(bad.generate_stream("x", max_tokens=1))
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    bad.close()


def test_deadline_and_cancel_free_the_slot(server, grpc_client):
    with pytest.raises(grpc.RpcError) as error:
        list(grpc_client.stub.GenerateStream(grpc_client.request("slow", max_tokens=20000, ignore_eos=True),
                                             metadata=grpc_client.metadata, timeout=0.5))
    assert error.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    server.wait_idle()
    call = grpc_client.stub.GenerateStream(grpc_client.request("cancel me", max_tokens=20000, ignore_eos=True),
                                           metadata=grpc_client.metadata)
    for i, _ in enumerate(call):
        if i == 2:
            break
    call.cancel()
    server.wait_idle()
    unary = grpc_client.stub.Generate.future(grpc_client.request("unary", max_tokens=20000, ignore_eos=True),
                                             metadata=grpc_client.metadata)
    deadline = time.monotonic() + 10
    while server.metric("lair_requests_running") == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    unary.cancel()
    server.wait_idle()


def test_health_service(server):
    with grpc.insecure_channel(server.grpc_target) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check",
                                    request_serializer=lambda raw: raw, response_deserializer=lambda raw: raw)
        # An empty HealthCheckRequest; the answer is HealthCheckResponse{status: SERVING (1)}.
        assert check(b"", timeout=10) == b"\x08\x01"
