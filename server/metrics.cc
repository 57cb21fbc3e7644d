#include "server/metrics.h"

#include <algorithm>
#include <cstdio>

namespace lair::server {
namespace {

std::string Number(double value) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.9g", value);
  return buf;
}

void Header(const std::string& name, const char* type, const std::string& help, std::string* out) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void Scalar(const std::string& name, const char* type, const std::string& help, double value,
            std::string* out) {
  Header(name, type, help, out);
  *out += name + " " + Number(value) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

void Histogram::Render(const std::string& name, const std::string& help, std::string* out) const {
  Header(name, "histogram", help, out);
  int64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    *out +=
        name + "_bucket{le=\"" + Number(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  *out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  *out += name + "_sum " + Number(sum_) + "\n";
  *out += name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : time_to_first_token_(
          {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}),
      inter_token_latency_(
          {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1}),
      end_to_end_({0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120}) {}

void Metrics::RecordResponse(std::string_view protocol, std::string_view code) {
  absl::MutexLock lock(&mu_);
  ++responses_[{std::string(protocol), std::string(code)}];
}

void Metrics::RecordFinish(engine::FinishReason reason) {
  absl::MutexLock lock(&mu_);
  ++finishes_[engine::FinishReasonName(reason)];
}

void Metrics::ObserveTimeToFirstToken(double seconds) {
  absl::MutexLock lock(&mu_);
  time_to_first_token_.Observe(seconds);
}

void Metrics::ObserveInterTokenLatency(double seconds) {
  absl::MutexLock lock(&mu_);
  inter_token_latency_.Observe(seconds);
}

void Metrics::ObserveEndToEnd(double seconds) {
  absl::MutexLock lock(&mu_);
  end_to_end_.Observe(seconds);
}

std::string Metrics::Render(const engine::EngineStats& stats) const {
  std::string out;
  absl::MutexLock lock(&mu_);
  Header("lair_requests_total", "counter", "Responses sent, by protocol and status code.", &out);
  for (const auto& [key, count] : responses_) {
    out += "lair_requests_total{protocol=\"" + key.first + "\",code=\"" + key.second + "\"} " +
           std::to_string(count) + "\n";
  }
  Header("lair_request_finish_total", "counter", "Completions finished, by finish reason.", &out);
  for (const auto& [reason, count] : finishes_) {
    out += "lair_request_finish_total{reason=\"" + reason + "\"} " + std::to_string(count) + "\n";
  }
  Scalar("lair_prompt_tokens_total", "counter", "Prompt tokens processed.",
         static_cast<double>(stats.prompt_tokens_total), &out);
  Scalar("lair_generation_tokens_total", "counter", "Tokens generated.",
         static_cast<double>(stats.generated_tokens_total), &out);
  time_to_first_token_.Render("lair_time_to_first_token_seconds",
                              "Submit to first generated token.", &out);
  inter_token_latency_.Render("lair_inter_token_latency_seconds", "Time between generated tokens.",
                              &out);
  end_to_end_.Render("lair_e2e_request_latency_seconds",
                     "Submit to the last output of a completion.", &out);
  Scalar("lair_requests_running", "gauge", "Requests being decoded.", stats.running, &out);
  Scalar("lair_requests_waiting", "gauge", "Requests queued.", stats.waiting, &out);
  Scalar("lair_state_slots_used", "gauge", "Recurrent-state slots in use.", stats.slots_used, &out);
  Scalar("lair_state_slots_total", "gauge", "Recurrent-state slots in the pool.", stats.slots_total,
         &out);
  Scalar("lair_state_slot_bytes", "gauge", "Bytes of one state slot.",
         static_cast<double>(stats.bytes_per_slot), &out);
  Scalar("lair_state_slot_usage_ratio", "gauge", "Fraction of state slots in use.",
         stats.slots_total > 0 ? static_cast<double>(stats.slots_used) / stats.slots_total : 0.0,
         &out);
  Scalar("lair_engine_steps_total", "counter", "Engine steps run.",
         static_cast<double>(stats.steps_total), &out);
  Scalar("lair_preemptions_total", "counter", "Requests preempted to free state slots.",
         static_cast<double>(stats.preemptions_total), &out);
  return out;
}

}  // namespace lair::server
