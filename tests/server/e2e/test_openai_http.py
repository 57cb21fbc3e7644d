"""The OpenAI-compatible HTTP API, driven by the official openai client."""

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from conftest import API_KEY, MAX_PROMPT_TOKENS

GREEDY = dict(temperature=0, extra_body={"ignore_eos": True})


def complete(client, model, prompt, **kwargs):
    args = dict(GREEDY)
    args.update(kwargs)
    return client.completions.create(model=model, prompt=prompt, **args)


def test_health_and_models(server, client):
    assert json.loads(server.get("/health")) == {"status": "ok"}
    models = client.models.list()
    assert [m.id for m in models.data] == [server.model]


def test_completion_length_and_usage(server, client):
    response = complete(client, server.model, "Hello", max_tokens=8)
    choice = response.choices[0]
    assert response.object == "text_completion" and response.model == server.model
    assert isinstance(choice.text, str)
    assert choice.finish_reason == "length"
    assert response.usage.completion_tokens == 8
    assert response.usage.prompt_tokens > 0
    assert response.usage.total_tokens == response.usage.prompt_tokens + 8


def test_greedy_is_deterministic_and_token_prompts_work(server, client):
    first = complete(client, server.model, "Once upon a time", max_tokens=12).choices[0].text
    second = complete(client, server.model, "Once upon a time", max_tokens=12).choices[0].text
    assert first == second
    several = complete(client, server.model, ["Once upon a time", [65, 66, 67]], max_tokens=4)
    assert sorted(c.index for c in several.choices) == [0, 1]


def test_stream_matches_non_stream(server, client):
    expected = complete(client, server.model, "The quick brown fox", max_tokens=16).choices[0].text
    chunks = list(complete(client, server.model, "The quick brown fox", max_tokens=16, stream=True,
                           stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == expected
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16


def test_raw_sse_framing(server):
    body = {"model": server.model, "prompt": "abc", "max_tokens": 3, "stream": True, "temperature": 0}
    with httpx.stream("POST", server.base_url + "/v1/completions", json=body, timeout=30,
                      headers={"Authorization": f"Bearer {API_KEY}"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for event in events[:-2]:
        assert event.startswith("data: ")
        assert json.loads(event[len("data: "):])["object"] == "text_completion"


def test_chat_and_chat_stream(server, client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]
    response = client.chat.completions.create(model=server.model, messages=messages, max_tokens=10, **GREEDY)
    message = response.choices[0].message
    assert response.object == "chat.completion" and message.role == "assistant"
    assert response.usage.completion_tokens == 10
    stream = client.chat.completions.create(model=server.model, messages=messages, max_tokens=10, stream=True,
                                            **GREEDY)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_n_greater_than_one_with_seed(server, client):
    args = dict(model=server.model, prompt="Numbers:", max_tokens=6, n=3, temperature=1.0, seed=7,
                extra_body={"ignore_eos": True})
    first = client.completions.create(**args)
    assert sorted(c.index for c in first.choices) == [0, 1, 2]
    assert first.usage.completion_tokens == 18
    again = client.completions.create(**args)
    assert [c.text for c in sorted(first.choices, key=lambda c: c.index)] == \
           [c.text for c in sorted(again.choices, key=lambda c: c.index)]
    streamed = client.completions.create(stream=True, **args)
    texts = {0: "", 1: "", 2: ""}
    for chunk in streamed:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    assert [texts[i] for i in range(3)] == [c.text for c in sorted(first.choices, key=lambda c: c.index)]


def test_stop_string(server, client):
    full = complete(client, server.model, "Stop test", max_tokens=24).choices[0].text
    if len(full) < 8:
        pytest.skip(f"the model's text is too short to pick a stop string from: {full!r}")
    stop = full[5:7]
    response = complete(client, server.model, "Stop test", max_tokens=24, stop=[stop])
    assert response.choices[0].text == full[:full.find(stop)]
    assert response.choices[0].finish_reason == "stop"


def test_logprobs_completion_and_chat(server, client):
    response = complete(client, server.model, "Log", max_tokens=5, logprobs=2)
    logprobs = response.choices[0].logprobs
    assert len(logprobs.tokens) == 5 and len(logprobs.token_logprobs) == 5
    assert all(lp <= 0 for lp in logprobs.token_logprobs)
    assert all(len(top) >= 1 for top in logprobs.top_logprobs)
    chat = client.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "x"}],
                                          max_tokens=4, logprobs=True, top_logprobs=2, **GREEDY)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4
    assert all(len(entry.top_logprobs) == 2 and entry.logprob <= 0 for entry in content)


def test_64_concurrent_streams(server, client):
    prompts = [f"Request number {i}:" for i in range(64)]
    expected = [complete(client, server.model, p, max_tokens=12).choices[0].text for p in prompts]
    barrier = threading.Barrier(64, timeout=60)

    def stream(prompt):
        barrier.wait()
        chunks = complete(client, server.model, prompt, max_tokens=12, stream=True)
        return "".join(c.choices[0].text for c in chunks if c.choices)

    with ThreadPoolExecutor(max_workers=64) as pool:
        results = list(pool.map(stream, prompts, timeout=300))
    assert results == expected
    server.wait_idle()


def test_disconnect_mid_stream_frees_the_slot(server, client):
    stream = complete(client, server.model, "Go on forever", max_tokens=20000, stream=True)
    received = 0
    for chunk in stream:
        received += 1
        if received == 3:
            break
    assert server.metric("lair_requests_running") >= 1
    stream.close()
    server.wait_idle()
    assert complete(client, server.model, "still serving", max_tokens=2).choices[0].finish_reason == "length"


def raw_post(server, path, content, key=API_KEY):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(server.base_url + path, content=content, headers=headers, timeout=30)


def assert_error(response, status, param=None):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param
    return error


def test_echo_lists_the_prompt_and_its_logprobs(server, client):
    prompt = "Echo me"
    plain = complete(client, server.model, prompt, max_tokens=3).choices[0].text
    echoed = complete(client, server.model, prompt, max_tokens=3, echo=True, logprobs=1)
    choice = echoed.choices[0]
    assert choice.text == prompt + plain
    logprobs = choice.logprobs
    assert len(logprobs.tokens) == echoed.usage.prompt_tokens + 3
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert all(lp <= 0 for lp in logprobs.token_logprobs[1:])
    assert all(len(top) >= 1 for top in logprobs.top_logprobs[1:])
    streamed = complete(client, server.model, prompt, max_tokens=3, echo=True, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == choice.text
    alone = complete(client, server.model, prompt, max_tokens=0, echo=True, logprobs=1).choices[0]
    assert alone.text == prompt and alone.finish_reason == "length"
    assert alone.logprobs.tokens == logprobs.tokens[:echoed.usage.prompt_tokens]
    assert alone.logprobs.token_logprobs[1:] == logprobs.token_logprobs[1:echoed.usage.prompt_tokens]
    several = complete(client, server.model, [prompt, [65, 66]], max_tokens=2, echo=True, n=2)
    assert sorted(c.index for c in several.choices) == [0, 1, 2, 3]
    assert all(c.text.startswith(prompt) for c in several.choices if c.index < 2)


def test_truncate_prompt_tokens_keeps_the_end(server, client):
    ids = raw_post(server, "/tokenize", json.dumps({"prompt": "a longer prompt to cut"})).json()["tokens"]
    cut = complete(client, server.model, "a longer prompt to cut", max_tokens=2,
                   extra_body={"ignore_eos": True, "truncate_prompt_tokens": 3})
    assert cut.usage.prompt_tokens == 3
    assert cut.choices[0].text == complete(client, server.model, ids[-3:], max_tokens=2).choices[0].text
    too_long = "x" * (MAX_PROMPT_TOKENS + 10)
    kept = complete(client, server.model, too_long, max_tokens=1,
                    extra_body={"ignore_eos": True, "truncate_prompt_tokens": 5})
    assert kept.usage.prompt_tokens == 5
    assert_error(raw_post(server, "/v1/completions", json.dumps({"prompt": "x", "truncate_prompt_tokens": 0})),
                 400, "truncate_prompt_tokens")


def test_tokenize_and_detokenize(server, client):
    tokenized = raw_post(server, "/tokenize", json.dumps({"prompt": "round trip", "add_special_tokens": False}))
    assert tokenized.status_code == 200, tokenized.text
    body = tokenized.json()
    assert body["count"] == len(body["tokens"]) == len(body["token_strs"]) > 0
    assert body["max_model_len"] > 0
    detokenized = raw_post(server, "/detokenize", json.dumps({"tokens": body["tokens"]}))
    assert detokenized.status_code == 200 and detokenized.json() == {"prompt": "round trip"}
    usage = complete(client, server.model, "round trip", max_tokens=1).usage
    with_special = raw_post(server, "/tokenize", json.dumps({"prompt": "round trip"})).json()
    assert with_special["count"] == usage.prompt_tokens
    chat = raw_post(server, "/tokenize", json.dumps({"messages": [{"role": "user", "content": "hi"}]}))
    assert chat.status_code == 200 and chat.json()["count"] > 0
    assert_error(raw_post(server, "/tokenize", json.dumps({"prompt": "x", "messages": []})), 400, "prompt")
    assert_error(raw_post(server, "/detokenize", json.dumps({"tokens": [10 ** 7]})), 400, "tokens")
    assert_error(raw_post(server, "/detokenize", json.dumps({"tokens": "x"})), 400, "tokens")
    assert_error(raw_post(server, "/tokenize", json.dumps({"prompt": "x"}), key="wrong"), 401)


def test_client_errors_get_openai_error_bodies(server, client):
    assert_error(raw_post(server, "/v1/completions", b'{"prompt": "x", '), 400)
    assert_error(raw_post(server, "/v1/completions", json.dumps({"prompt": "x", "max_tokens": "ten"})), 400,
                 "max_tokens")
    assert_error(raw_post(server, "/v1/chat/completions", json.dumps({"messages": "hi"})), 400, "messages")
    assert_error(raw_post(server, "/v1/completions",
                          json.dumps({"prompt": "x" * (MAX_PROMPT_TOKENS + 10), "max_tokens": 1})), 400, "prompt")
    assert_error(raw_post(server, "/v1/completions", json.dumps({"prompt": [1, 10 ** 7]})), 400, "prompt")
    assert_error(raw_post(server, "/v1/completions", json.dumps({"prompt": "x", "model": "nope"})), 404)
    assert_error(raw_post(server, "/v1/completions", json.dumps({"prompt": "x"}), key="wrong"), 401)
    assert_error(raw_post(server, "/v1/completions", json.dumps({"prompt": "x"}), key=None), 401)
    assert_error(raw_post(server, "/v1/completions", json.dumps({"prompt": "x", "suffix": "y"})), 422, "suffix")
    assert_error(raw_post(server, "/v1/completions", json.dumps({"prompt": "x", "max_tokens": 0})), 400,
                 "max_tokens")
    assert_error(raw_post(server, "/v1/nothing", b"{}"), 404)
    assert_error(raw_post(server, "/v1/completions", b"x" * (9 << 20)), 413)
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
    with pytest.raises(openai.AuthenticationError):
        with openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0) as bad:
            bad.models.list()
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=server.model, prompt="x", max_tokens=1, temperature=5)
    assert complete(client, server.model, "still serving", max_tokens=2).usage.completion_tokens == 2


def test_metrics_exposition(server, client):
    complete(client, server.model, "metrics", max_tokens=3)
    text = server.get("/metrics")
    for name in ["lair_time_to_first_token_seconds_bucket", "lair_inter_token_latency_seconds_count",
                 "lair_e2e_request_latency_seconds_sum", "lair_requests_running", "lair_requests_waiting",
                 "lair_state_slots_used", "lair_state_slots_total", "lair_prompt_tokens_total",
                 "lair_generation_tokens_total"]:
        assert name in text, name
    assert 'lair_requests_total{protocol="http",code="200"}' in text
    assert 'lair_requests_total{protocol="http",code="400"}' in text
    assert server.metric("lair_generation_tokens_total") > 0
