"""Graceful shutdown: SIGTERM lets a stream in flight finish, then the process exits 0."""

import signal

import openai

from conftest import API_KEY, start_server, stop_server


def test_sigterm_drains_in_flight_stream(tmp_path):
    server = start_server(tmp_path)
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=60) as client:
        stream = client.completions.create(model=server.model, prompt="drain", max_tokens=200, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        first = next(chunks)
        server.process.send_signal(signal.SIGTERM)
        rest = list(chunks)
    finishes = [c.choices[0].finish_reason for c in [first, *rest] if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"], open(server.log).read()
    assert stop_server(server) == 0, open(server.log).read()
