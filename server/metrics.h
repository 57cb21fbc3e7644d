// Metrics: the server's Prometheus counters and histograms, rendered as the
// text exposition format (version 0.0.4) for GET /metrics.
//
// Exposed (prefix lair_):
//   requests_total{protocol,code}          responses sent, by protocol and status
//   request_finish_total{reason}           completions finished, by finish reason
//   prompt_tokens_total, generation_tokens_total   (from the engine)
//   time_to_first_token_seconds, inter_token_latency_seconds,
//   e2e_request_latency_seconds            histograms, observed per completion
//   requests_running, requests_waiting     gauges (from the engine)
//   state_slots_used, state_slots_total, state_slot_bytes, state_slot_usage_ratio
//   engine_steps_total, preemptions_total
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "engine/engine.h"

namespace lair::server {

// A cumulative histogram over fixed upper bounds (plus +Inf).
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);
  // Appends NAME_bucket{le=...}, NAME_sum and NAME_count lines.
  void Render(const std::string& name, const std::string& help, std::string* out) const;

 private:
  std::vector<double> bounds_;   // ascending upper bounds
  std::vector<int64_t> counts_;  // per bucket, not cumulative; last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // `code` is the HTTP status or the gRPC code name.
  void RecordResponse(std::string_view protocol, std::string_view code);
  void RecordFinish(engine::FinishReason reason);
  void ObserveTimeToFirstToken(double seconds);
  void ObserveInterTokenLatency(double seconds);
  void ObserveEndToEnd(double seconds);

  // The whole exposition, with engine gauges and totals taken from `stats`.
  std::string Render(const engine::EngineStats& stats) const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, int64_t> responses_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> finishes_ ABSL_GUARDED_BY(mu_);
  Histogram time_to_first_token_ ABSL_GUARDED_BY(mu_);
  Histogram inter_token_latency_ ABSL_GUARDED_BY(mu_);
  Histogram end_to_end_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lair::server
