#include "server/grpc_service.h"

#include <deque>
#include <map>

#include "absl/synchronization/mutex.h"
#include "server/openai_handlers.h"

namespace lair::server {
namespace {

void RecordCall(EngineClient& client, const absl::Status& status) {
  client.metrics().RecordResponse("grpc", absl::StatusCodeToString(status.code()));
}

void CopySampling(const v1::SamplingParams& in, engine::SamplingParams* out) {
  if (in.has_n()) out->n = in.n();
  if (in.has_max_tokens()) out->max_tokens = in.max_tokens();
  if (in.has_temperature()) out->temperature = in.temperature();
  if (in.has_top_p()) out->top_p = in.top_p();
  if (in.has_top_k()) out->top_k = in.top_k();
  if (in.has_min_p()) out->min_p = in.min_p();
  if (in.has_repetition_penalty()) out->repetition_penalty = in.repetition_penalty();
  if (in.has_presence_penalty()) out->presence_penalty = in.presence_penalty();
  if (in.has_frequency_penalty()) out->frequency_penalty = in.frequency_penalty();
  for (const auto& [id, bias] : in.logit_bias()) out->logit_bias[id] = bias;
  if (in.has_seed()) out->seed = in.seed();
  out->stop_token_ids.assign(in.stop_token_ids().begin(), in.stop_token_ids().end());
  out->allowed_token_ids.assign(in.allowed_token_ids().begin(), in.allowed_token_ids().end());
  out->stop.assign(in.stop().begin(), in.stop().end());
  out->ignore_eos = in.ignore_eos();
  out->include_stop_str_in_output = in.include_stop_str_in_output();
  if (in.has_logprobs()) out->logprobs = in.logprobs();
  if (in.has_prompt_logprobs()) out->prompt_logprobs = in.prompt_logprobs();
  if (in.has_min_tokens()) out->min_tokens = in.min_tokens();
  if (in.has_skip_special_tokens()) out->skip_special_tokens = in.skip_special_tokens();
}

// Validates a GenerateRequest and turns it into prompt tokens and sampling.
absl::Status Prepare(const EngineClient& client, const v1::GenerateRequest& request,
                     std::vector<int32_t>* prompt, engine::SamplingParams* sampling) {
  LAIR_RETURN_IF_ERROR(client.CheckModel(request.model()));
  CopySampling(request.sampling(), sampling);
  if (sampling->n < 1) return absl::InvalidArgumentError("sampling.n: must be at least 1");
  switch (request.prompt_case()) {
    case v1::GenerateRequest::kText: {
      LAIR_ASSIGN_OR_RETURN(*prompt, client.PromptTokens(request.text(), "text"));
      if (request.has_add_special_tokens() && !request.add_special_tokens()) {
        *prompt = client.Tokenize(request.text(), false);
        LAIR_RETURN_IF_ERROR(client.CheckPrompt(*prompt, "text"));
      }
      return absl::OkStatus();
    }
    case v1::GenerateRequest::kTokenIds: {
      std::vector<int32_t> ids(request.token_ids().ids().begin(), request.token_ids().ids().end());
      LAIR_ASSIGN_OR_RETURN(*prompt, client.PromptTokens(std::move(ids), "token_ids"));
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError("prompt: set text or token_ids");
  }
}

void FillLogprobs(const EngineClient& client, const std::vector<engine::TokenLogprob>& logprobs,
                  google::protobuf::RepeatedPtrField<v1::TokenLogprob>* out) {
  for (const engine::TokenLogprob& lp : logprobs) {
    v1::TokenLogprob* entry = out->Add();
    entry->set_token_id(lp.token);
    entry->set_token(client.TokenText(lp.token));
    entry->set_logprob(lp.logprob);
    for (const auto& [id, value] : lp.top) {
      v1::TopLogprob* top = entry->add_top();
      top->set_token_id(id);
      top->set_token(client.TokenText(id));
      top->set_logprob(value);
    }
  }
}

// How a finished generation ends the call: OK, CANCELLED when the engine
// cancelled it (client gone, deadline, shutdown), or a completion's error.
absl::Status CallStatus(const engine::RequestOutput& last) {
  if (last.finish_reason == engine::FinishReason::kCancelled)
    return absl::CancelledError("request cancelled");
  if (last.finish_reason == engine::FinishReason::kError) {
    return last.status.ok() ? absl::InternalError("generation failed") : last.status;
  }
  return absl::OkStatus();
}

// One Generate call. States: running (engine completions unfinished) ->
// finished (Finish called once, after the last final output or a submit
// error) -> done (OnDone deletes it). Engine callbacks never outlive it:
// Finish comes only after every completion's final output.
class GenerateReactor final : public grpc::ServerUnaryReactor {
 public:
  GenerateReactor(EngineClient& client, v1::GenerateResponse* response)
      : client_(client), response_(response) {}

  void Start(const absl::Status& auth, const v1::GenerateRequest& request) {
    std::vector<int32_t> prompt;
    engine::SamplingParams sampling;
    absl::Status status = auth.ok() ? Prepare(client_, request, &prompt, &sampling) : auth;
    if (!status.ok()) return End(status);
    {
      absl::MutexLock lock(&mu_);
      unfinished_ = sampling.n;
      submitting_ = true;
      usage_.prompt_tokens = static_cast<int>(prompt.size());
      for (int i = 0; i < sampling.n; ++i) response_->add_completions()->set_index(i);
    }
    absl::StatusOr<std::string> id = client_.Submit(
        std::move(prompt), sampling, [this](const engine::RequestOutput& out) { OnOutput(out); });
    if (!id.ok()) return End(id.status());
    bool cancel = false, done = false;
    absl::Status finish;
    {
      absl::MutexLock lock(&mu_);
      submitting_ = false;
      request_id_ = *id;
      cancel = cancelled_;
      done = unfinished_ == 0;
      if (done) finish = CompleteLocked();
    }
    if (done) return End(finish);  // the last use of `this`
    if (cancel) client_.Cancel(*id);
  }

  void OnCancel() override {
    std::string id;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      id = request_id_;
    }
    if (!id.empty()) client_.Cancel(id);
  }
  void OnDone() override { delete this; }

 private:
  void OnOutput(const engine::RequestOutput& out) {
    absl::Status status;
    {
      absl::MutexLock lock(&mu_);
      v1::Completion* completion = response_->mutable_completions(out.index);
      completion->mutable_text()->append(out.text_delta);
      completion->mutable_token_ids()->Add(out.new_tokens.begin(), out.new_tokens.end());
      FillLogprobs(client_, out.logprobs, completion->mutable_logprobs());
      FillLogprobs(client_, out.prompt_logprobs, completion->mutable_prompt_logprobs());
      usage_.completion_tokens += static_cast<int>(out.new_tokens.size());
      if (!out.finished()) return;
      request_id_ = out.request_id;
      completion->set_finish_reason(engine::FinishReasonName(out.finish_reason));
      completion->set_stop_reason(out.stop_reason);
      absl::Status finish = CallStatus(out);
      if (!finish.ok() && first_error_.ok()) first_error_ = finish;
      if (--unfinished_ > 0 || submitting_) return;
      status = CompleteLocked();
    }
    End(status);  // the last use of `this`
  }

  // Fills the response's totals; returns the call's status.
  absl::Status CompleteLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    response_->set_request_id(request_id_);
    response_->set_model(client_.model_name());
    response_->mutable_usage()->set_prompt_tokens(usage_.prompt_tokens);
    response_->mutable_usage()->set_completion_tokens(usage_.completion_tokens);
    response_->mutable_usage()->set_total_tokens(usage_.prompt_tokens + usage_.completion_tokens);
    return first_error_;
  }

  void End(const absl::Status& status) {
    RecordCall(client_, status);
    Finish(ToGrpcStatus(status));
  }

  EngineClient& client_;
  v1::GenerateResponse* const response_;  // owned by gRPC, valid until OnDone
  absl::Mutex mu_;
  std::string request_id_ ABSL_GUARDED_BY(mu_);   // empty until Submit returned
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;   // OnCancel ran
  bool submitting_ ABSL_GUARDED_BY(mu_) = false;  // inside Start's Submit: Finish must wait for it
  int unfinished_ ABSL_GUARDED_BY(mu_) = 0;       // completions without their final output
  engine::Usage usage_ ABSL_GUARDED_BY(mu_);
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
};

// One GenerateStream call. States: streaming (engine completions
// unfinished; outputs queue up as messages, written one at a time) ->
// draining (engine done, writes still queued) -> finished (Finish called) ->
// done (OnDone deletes it). A failed write (client gone) drops the queue and
// cancels the engine request; Finish still waits for the engine's final
// outputs, so no engine callback outlives the reactor.
class GenerateStreamReactor final : public grpc::ServerWriteReactor<v1::GenerateStreamResponse> {
 public:
  explicit GenerateStreamReactor(EngineClient& client) : client_(client) {}

  void Start(const absl::Status& auth, const v1::GenerateRequest& request) {
    std::vector<int32_t> prompt;
    engine::SamplingParams sampling;
    absl::Status status = auth.ok() ? Prepare(client_, request, &prompt, &sampling) : auth;
    if (!status.ok()) return End(status);
    {
      absl::MutexLock lock(&mu_);
      unfinished_ = sampling.n;
      submitting_ = true;
      prompt_tokens_ = static_cast<int>(prompt.size());
    }
    absl::StatusOr<std::string> id = client_.Submit(
        std::move(prompt), sampling, [this](const engine::RequestOutput& out) { OnOutput(out); });
    if (!id.ok()) return End(id.status());
    bool cancel = false, ready = false;
    absl::Status finish;
    {
      absl::MutexLock lock(&mu_);
      submitting_ = false;
      request_id_ = *id;
      cancel = cancelled_;
      ready = ReadyToFinish();
      finish = status_;
    }
    if (ready) return End(finish);  // the last use of `this`
    if (cancel) client_.Cancel(*id);
  }

  void OnCancel() override { CancelEngine(); }
  void OnWriteDone(bool ok) override {
    if (!ok) CancelEngine();
    const v1::GenerateStreamResponse* next = nullptr;
    absl::Status finish;
    {
      absl::MutexLock lock(&mu_);
      queue_.pop_front();
      if (!ok) queue_.clear();
      if (!queue_.empty()) {
        next = &queue_.front();
      } else {
        writing_ = false;
        if (!ReadyToFinish()) return;
        finish = status_;
      }
    }
    if (next) return StartWrite(next);
    End(finish);  // the last use of `this`
  }
  void OnDone() override { delete this; }

 private:
  void OnOutput(const engine::RequestOutput& out) {
    const v1::GenerateStreamResponse* write = nullptr;
    absl::Status finish;
    {
      absl::MutexLock lock(&mu_);
      if (out.finished()) {
        --unfinished_;
        absl::Status call = CallStatus(out);
        if (!call.ok() && status_.ok()) status_ = call;
      }
      if (!cancelled_) {
        queue_.push_back(Message(out));
        if (!writing_) {
          writing_ = true;
          write = &queue_.back();
        }
      }
      if (!write && !ReadyToFinish()) return;
      finish = status_;
    }
    if (write) return StartWrite(write);
    End(finish);  // the last use of `this`
  }

  v1::GenerateStreamResponse Message(const engine::RequestOutput& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::GenerateStreamResponse message;
    message.set_request_id(out.request_id);
    message.set_index(out.index);
    message.set_text(out.text_delta);
    message.mutable_token_ids()->Add(out.new_tokens.begin(), out.new_tokens.end());
    FillLogprobs(client_, out.logprobs, message.mutable_logprobs());
    FillLogprobs(client_, out.prompt_logprobs, message.mutable_prompt_logprobs());
    if (out.finished()) {
      message.set_finish_reason(engine::FinishReasonName(out.finish_reason));
      message.set_stop_reason(out.stop_reason);
      message.mutable_usage()->set_prompt_tokens(prompt_tokens_);
      message.mutable_usage()->set_completion_tokens(out.usage.completion_tokens);
      message.mutable_usage()->set_total_tokens(prompt_tokens_ + out.usage.completion_tokens);
    }
    return message;
  }

  // Claims the one Finish: true when the engine is done, nothing is being
  // written, Start has returned from Submit, and Finish was not called yet.
  bool ReadyToFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (unfinished_ > 0 || writing_ || submitting_ || finished_) return false;
    finished_ = true;
    return true;
  }

  void CancelEngine() {
    std::string id;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      id = request_id_;
    }
    if (!id.empty()) client_.Cancel(id);
  }

  void End(const absl::Status& status) {
    RecordCall(client_, status);
    Finish(ToGrpcStatus(status));
  }

  EngineClient& client_;
  absl::Mutex mu_;
  std::string request_id_ ABSL_GUARDED_BY(mu_);  // empty until Submit returned
  int prompt_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int unfinished_ ABSL_GUARDED_BY(mu_) = 0;       // completions without their final output
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;   // client gone: write nothing more
  bool writing_ ABSL_GUARDED_BY(mu_) = false;     // a StartWrite is in flight (of queue_.front())
  bool submitting_ ABSL_GUARDED_BY(mu_) = false;  // inside Start's Submit: Finish must wait for it
  bool finished_ ABSL_GUARDED_BY(mu_) = false;    // Finish was claimed
  absl::Status status_ ABSL_GUARDED_BY(mu_);      // the call's final status
  std::deque<v1::GenerateStreamResponse> queue_ ABSL_GUARDED_BY(mu_);  // front is being written
};

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status GrpcService::Authenticate(const grpc::CallbackServerContext& context) const {
  if (api_key_.empty()) return absl::OkStatus();
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  std::string_view value = it == metadata.end()
                               ? std::string_view()
                               : std::string_view(it->second.data(), it->second.size());
  if (BearerMatches(value, api_key_) && it != metadata.end()) return absl::OkStatus();
  return absl::UnauthenticatedError("missing or invalid API key (send authorization: Bearer KEY)");
}

grpc::ServerUnaryReactor* GrpcService::FinishNow(grpc::CallbackServerContext* context,
                                                 const absl::Status& status) {
  RecordCall(*client_, status);
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::Generate(grpc::CallbackServerContext* context,
                                                const v1::GenerateRequest* request,
                                                v1::GenerateResponse* response) {
  auto* reactor = new GenerateReactor(*client_, response);
  reactor->Start(Authenticate(*context), *request);
  return reactor;
}

grpc::ServerWriteReactor<v1::GenerateStreamResponse>* GrpcService::GenerateStream(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto* reactor = new GenerateStreamReactor(*client_);
  reactor->Start(Authenticate(*context), *request);
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::Tokenize(grpc::CallbackServerContext* context,
                                                const v1::TokenizeRequest* request,
                                                v1::TokenizeResponse* response) {
  absl::Status status = Authenticate(*context);
  if (status.ok()) status = client_->CheckModel(request->model());
  if (status.ok()) {
    bool special = !request->has_add_special_tokens() || request->add_special_tokens();
    for (int32_t id : client_->Tokenize(request->text(), special)) {
      response->add_token_ids(id);
      response->add_tokens(client_->TokenText(id));
    }
  }
  return FinishNow(context, status);
}

grpc::ServerUnaryReactor* GrpcService::Detokenize(grpc::CallbackServerContext* context,
                                                  const v1::DetokenizeRequest* request,
                                                  v1::DetokenizeResponse* response) {
  absl::Status status = Authenticate(*context);
  if (status.ok()) status = client_->CheckModel(request->model());
  for (int32_t id : request->token_ids()) {
    if (status.ok() && (id < 0 || id >= client_->vocab_size())) {
      status = absl::InvalidArgumentError("token_ids: " + std::to_string(id) +
                                          " is outside the vocabulary");
    }
  }
  if (status.ok()) {
    std::vector<int32_t> ids(request->token_ids().begin(), request->token_ids().end());
    response->set_text(client_->Detokenize(ids, request->skip_special_tokens()));
  }
  return FinishNow(context, status);
}

grpc::ServerUnaryReactor* GrpcService::ListModels(grpc::CallbackServerContext* context,
                                                  const v1::ListModelsRequest*,
                                                  v1::ListModelsResponse* response) {
  absl::Status status = Authenticate(*context);
  if (status.ok()) {
    v1::ModelInfo* model = response->add_models();
    model->set_id(client_->model_name());
    model->set_vocab_size(client_->vocab_size());
    model->set_max_prompt_tokens(client_->max_prompt_tokens());
  }
  return FinishNow(context, status);
}

}  // namespace lair::server
