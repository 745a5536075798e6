#pragma once
// Scripted lease history for the visibility tests: a service on the example policy with an injected clock.
#include <atomic>
#include <memory>
#include <string>

#include "quota/server/metrics.h"
#include "quota/service/service.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota::testing {

// Monday 09:00 UTC (team-cv's burst window is open: 08:00-11:00 UTC).
// t0: alice leases 1 (4 GPUs, job "idle-sweep") and 2 (4 GPUs, "detector"), erin lease 3 (6 GPUs, "grasp"),
//     ivan asks for 3 GPUs (interns' limit is 2 on a Monday) and waits as lease 4.
// Heartbeats every 30 s for 90 minutes: lease 1 at 10 % utilisation, lease 2 at 90 %, lease 3 at 15 % for the
// first 30 minutes then 80 %. At t0+90 min lease 2 is released (completed).
struct ScriptedHistory {
  std::shared_ptr<std::atomic<int64_t>> clock = std::make_shared<std::atomic<int64_t>>(kMonday + 9 * kHour);
  std::unique_ptr<QuotaService> service;
  std::unique_ptr<MetricsExporter> metrics;
  int64_t t0 = kMonday + 9 * kHour;

  explicit ScriptedHistory(const std::string& db_path = "") {
    ServiceOptions o;
    o.db_path = db_path;
    auto c = clock;
    o.clock = [c] { return c->load(); };
    service = std::make_unique<QuotaService>(example_policy(), o);
    metrics = std::make_unique<MetricsExporter>(*service);
  }
  // What GET /metrics answers (the exporter keeps its histograms between scrapes, as quotad's does).
  std::string metrics_text() { return metrics->text(); }
  int post(const std::string& path, const std::string& token, const std::string& body) {
    return service->handle(api_call("POST", path, token, body)).status;
  }
  void run() {
    post("/v1/leases", "alice-token", R"({"model":"yolov8s","gpus":4,"job":"idle-sweep"})");
    post("/v1/leases", "alice-token", R"({"model":"yolov8s","gpus":4,"job":"detector"})");
    post("/v1/leases", "erin-token", R"({"model":"yolov8m","gpus":6,"job":"grasp"})");
    post("/v1/leases", "ivan-token", R"({"model":"yolov8n","gpus":3,"job":"intern-run"})");
    for (int step = 0; step <= 180; ++step) {
      *clock = t0 + static_cast<int64_t>(step) * 30000;
      post("/v1/leases/1/heartbeat", "alice-token", R"({"gpu_util":0.10,"memory_used_gib":12})");
      post("/v1/leases/2/heartbeat", "alice-token", R"({"gpu_util":0.90,"memory_used_gib":60})");
      post("/v1/leases/3/heartbeat", "erin-token",
           step < 60 ? R"({"gpu_util":0.15,"memory_used_gib":30})" : R"({"gpu_util":0.80,"memory_used_gib":30})");
      service->handle(api_call("GET", "/v1/leases/4", "ivan-token"));  // keeps the queued request alive
    }
    post("/v1/leases/2/release", "alice-token", R"({"outcome":"completed"})");
  }
};

}  // namespace yolo8::quota::testing
