#include "server/metrics.h"

#include "gtest/gtest.h"

namespace lair::server {
namespace {

bool Has(const std::string& text, const std::string& line) {
  return text.find(line + "\n") != std::string::npos;
}

TEST(MetricsTest, RendersCountersGaugesAndHistograms) {
  Metrics metrics;
  metrics.RecordResponse("http", "200");
  metrics.RecordResponse("http", "200");
  metrics.RecordResponse("grpc", "OK");
  metrics.RecordFinish(engine::FinishReason::kLength);
  metrics.ObserveTimeToFirstToken(0.003);
  metrics.ObserveTimeToFirstToken(20);
  metrics.ObserveInterTokenLatency(0.002);
  metrics.ObserveEndToEnd(0.5);
  engine::EngineStats stats;
  stats.running = 2;
  stats.waiting = 1;
  stats.slots_total = 8;
  stats.slots_used = 2;
  stats.bytes_per_slot = 1024;
  stats.prompt_tokens_total = 30;
  stats.generated_tokens_total = 40;
  const std::string text = metrics.Render(stats);
  EXPECT_TRUE(Has(text, "lair_requests_total{protocol=\"http\",code=\"200\"} 2")) << text;
  EXPECT_TRUE(Has(text, "lair_requests_total{protocol=\"grpc\",code=\"OK\"} 1"));
  EXPECT_TRUE(Has(text, "lair_request_finish_total{reason=\"length\"} 1"));
  EXPECT_TRUE(Has(text, "# TYPE lair_time_to_first_token_seconds histogram"));
  EXPECT_TRUE(Has(text, "lair_time_to_first_token_seconds_bucket{le=\"0.001\"} 0"));
  EXPECT_TRUE(Has(text, "lair_time_to_first_token_seconds_bucket{le=\"0.005\"} 1"));
  EXPECT_TRUE(Has(text, "lair_time_to_first_token_seconds_bucket{le=\"10\"} 1"));
  EXPECT_TRUE(Has(text, "lair_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2"));
  EXPECT_TRUE(Has(text, "lair_time_to_first_token_seconds_count 2"));
  EXPECT_TRUE(Has(text, "lair_time_to_first_token_seconds_sum 20.003"));
  EXPECT_TRUE(Has(text, "lair_inter_token_latency_seconds_count 1"));
  EXPECT_TRUE(Has(text, "lair_e2e_request_latency_seconds_count 1"));
  EXPECT_TRUE(Has(text, "lair_prompt_tokens_total 30"));
  EXPECT_TRUE(Has(text, "lair_generation_tokens_total 40"));
  EXPECT_TRUE(Has(text, "lair_requests_running 2"));
  EXPECT_TRUE(Has(text, "lair_requests_waiting 1"));
  EXPECT_TRUE(Has(text, "lair_state_slots_used 2"));
  EXPECT_TRUE(Has(text, "lair_state_slots_total 8"));
  EXPECT_TRUE(Has(text, "lair_state_slot_bytes 1024"));
  EXPECT_TRUE(Has(text, "lair_state_slot_usage_ratio 0.25"));
}

}  // namespace
}  // namespace lair::server
