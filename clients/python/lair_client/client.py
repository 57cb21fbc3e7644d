"""A thin convenience wrapper over the generated TextGeneration stub."""

from typing import Iterator, Optional

import grpc

from lair_client.codegen import load_stubs


class LairClient:
    """Talks to one LAIR server. `api_key` is sent as `authorization: Bearer KEY`."""

    def __init__(self, target: str, api_key: Optional[str] = None, timeout: Optional[float] = None):
        self.pb2, pb2_grpc = load_stubs()
        self.channel = grpc.insecure_channel(target)
        self.stub = pb2_grpc.TextGenerationStub(self.channel)
        self.metadata = [("authorization", f"Bearer {api_key}")] if api_key else []
        self.timeout = timeout

    def request(self, prompt, model: str = "", **sampling):
        """Builds a GenerateRequest from text (str) or token ids (list of int)."""
        params = self.pb2.SamplingParams(**sampling)
        if isinstance(prompt, str):
            return self.pb2.GenerateRequest(model=model, text=prompt, sampling=params)
        return self.pb2.GenerateRequest(model=model, token_ids=self.pb2.TokenIds(ids=list(prompt)), sampling=params)

    def generate(self, prompt, model: str = "", **sampling):
        return self.stub.Generate(self.request(prompt, model, **sampling), metadata=self.metadata,
                                  timeout=self.timeout)

    def generate_stream(self, prompt, model: str = "", **sampling) -> Iterator:
        return self.stub.GenerateStream(self.request(prompt, model, **sampling), metadata=self.metadata,
                                        timeout=self.timeout)

    def tokenize(self, text: str, add_special_tokens: bool = True):
        return self.stub.Tokenize(self.pb2.TokenizeRequest(text=text, add_special_tokens=add_special_tokens),
                                  metadata=self.metadata, timeout=self.timeout)

    def detokenize(self, ids, skip_special_tokens: bool = False):
        return self.stub.Detokenize(
            self.pb2.DetokenizeRequest(token_ids=list(ids), skip_special_tokens=skip_special_tokens),
            metadata=self.metadata, timeout=self.timeout)

    def list_models(self):
        return self.stub.ListModels(self.pb2.ListModelsRequest(), metadata=self.metadata, timeout=self.timeout)

    def close(self):
        self.channel.close()
