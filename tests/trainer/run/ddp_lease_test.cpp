// One lease for a data-parallel job, against a real quotad: two `yolo8 train` ranks over Gloo (CPU, as an indexed
// Job's pods would run), rank 0 holding a 2-GPU lease whose heartbeats report progress and utilisation; a
// higher-priority request revokes it and both ranks stop at the same step with exit 75.
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "common/exit_codes.h"
#include "data/synth.h"
#include "tests/quota/quotad_process.h"
#include "tests/trainer/process_util.h"
#include "trainer/core/checkpoint.h"
#include "trainer/run/launcher.h"

namespace yolo8 {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

using test::read_text;

// Two GPUs, alice's team may use both; bob's higher priority in the same team revokes her lease (no minimum
// runtime).
constexpr const char* kPolicy = R"(
inventory:
  nodes:
    - {name: n1, gpus: 2, memory_gib: 24}
emergency_pool: 0
users:
  admin: {role: admin, token_sha256: 10a4c7c9fc5206d6f36dc6944a81bb6f4a3cb0e25014ae3b12e6c3e52712292a}
  alice: {token_sha256: 9c220f200955d76c0a38d308225e0ef10c5f971acaf2f8d1d8f732affa5bd1dc}
  bob: {token_sha256: 97dd3707015dcf069cf73022ed7173b1165db6eff24b441cb57fd069a8c4e525}
teams:
  ta: {base: 2, burst: 2, members: [alice, bob]}
credits: {monthly_gpu_hours: 0}
leases: {ttl_s: 20, heartbeat_interval_s: 1, expiry_grace_s: 5}
preemption: {min_runtime_s: 0, grace_s: 60}
tiers: {self_service: [yolov8n, yolov8s], approval: [yolov8x]}
)";

httplib::Headers bearer(const std::string& token) { return {{"Authorization", "Bearer " + token}}; }

TEST(DdpLease, TwoRanksHoldOneTwoGpuLeaseAndBothExit75WhenItIsRevoked) {
  const fs::path root = fs::path(::testing::TempDir()) / ("yolo8_ddp_lease_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  data::synthesize_dataset((root / "ds").string(), 16, 4, 64, 11);
  test::QuotadProcess quotad;
  ASSERT_TRUE(quotad.start_in(root, kPolicy)) << read_text(root / "quotad.log");
  const std::string url = quotad.url();
  const int master_port = find_free_port();
  const std::vector<std::string> args{"train",
                                      "data=" + (root / "ds" / "data.yaml").string(),
                                      "model=yolov8n.yaml",
                                      "imgsz=64",
                                      "batch=8",
                                      "epochs=200",
                                      "workers=1",
                                      "threads=1",
                                      "device=cpu",
                                      "val=false",
                                      "plots=false",
                                      "quota=" + url,
                                      "team=ta",
                                      "user=alice",
                                      "priority=low",
                                      "project=" + (root / "runs").string(),
                                      "name=ddp"};
  pid_t ranks[2];
  for (int rank = 0; rank < 2; ++rank) {
    // As the indexed Job runs them: each pod one process, device=0 of its own (here the CPU).
    const std::map<std::string, std::string> env{{"RANK", std::to_string(rank)},
                                                 {"LOCAL_RANK", "0"},
                                                 {"WORLD_SIZE", "2"},
                                                 {"MASTER_ADDR", "127.0.0.1"},
                                                 {"MASTER_PORT", std::to_string(master_port)},
                                                 {"YOLO8_DIST_TIMEOUT", "120"},
                                                 {"YOLO8_QUOTA_TOKEN", "alice-token"}};
    ranks[rank] = test::spawn_yolo8(args, env, (root / ("rank" + std::to_string(rank) + ".log")).string());
  }

  // One lease, for both ranks, reporting utilisation from steps that advance.
  httplib::Client client("127.0.0.1", quotad.port());
  json lease;
  const auto deadline = Clock::now() + std::chrono::seconds(240);
  while (Clock::now() < deadline) {
    auto response = client.Get("/v1/leases", bearer("admin-token"));
    if (response && response->status == 200) {
      const json body = json::parse(response->body, nullptr, false);
      const json& list = body.is_object() && body.contains("leases") ? body["leases"] : body;
      for (const auto& candidate : list) {
        // (gpu_util_source is not asserted here: quotad re-reads telemetry from its heartbeats table, which does
        // not store it yet.)
        if (candidate.value("state", "") == "granted" && candidate["telemetry"].value("step", int64_t{-1}) >= 3 &&
            candidate["telemetry"].value("gpu_util", -1.0) >= 0) {
          lease = candidate;
        }
      }
    }
    if (!lease.is_null()) break;
    int status = 0;
    ASSERT_NE(waitpid(ranks[0], &status, WNOHANG), ranks[0]) << read_text(root / "rank0.log");
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_FALSE(lease.is_null()) << read_text(root / "rank0.log") << read_text(root / "quotad.log");
  EXPECT_EQ(lease["gpus"].get<int>(), 2) << lease.dump();
  const int64_t lease_id = lease["id"].get<int64_t>();
  // Only one lease: rank 1 asked for none.
  auto all = client.Get("/v1/leases", bearer("admin-token"));
  ASSERT_TRUE(all);
  EXPECT_EQ(all->body.find("\"id\":" + std::to_string(lease_id + 1)), std::string::npos) << all->body;

  // Bob's high-priority job needs both GPUs: alice's lease is revoked.
  auto queued =
      client.Post("/v1/leases", bearer("bob-token"),
                  R"({"team":"ta","job":"urgent","model":"yolov8n","gpus":2,"priority":"high"})", "application/json");
  ASSERT_TRUE(queued);
  ASSERT_EQ(queued->status, 202) << queued->body;
  const auto revoked_at = Clock::now();
  int exits[2];
  for (int rank = 0; rank < 2; ++rank) {
    int status = 0;
    ASSERT_EQ(waitpid(ranks[rank], &status, 0), ranks[rank]);
    exits[rank] = test::exit_code_of(status);
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - revoked_at).count();
  std::cout << "both ranks ended " << seconds << " s after the revocation\n";
  const std::string rank0_log = read_text(root / "rank0.log");
  EXPECT_EQ(exits[0], kExitPreempted) << rank0_log;
  EXPECT_EQ(exits[1], kExitPreempted);
  EXPECT_NE(rank0_log.find("Stopped (lease revoked)"), std::string::npos) << rank0_log;
  // The step-level checkpoint both ranks agreed on, and the lease released as preempted.
  EXPECT_TRUE(checkpoint_readable((root / "runs" / "ddp" / "weights" / "last.pt").string()));
  auto ended = client.Get(("/v1/leases/" + std::to_string(lease_id)).c_str(), bearer("admin-token"));
  ASSERT_TRUE(ended);
  const json ended_lease = json::parse(ended->body, nullptr, false);
  EXPECT_EQ(ended_lease.value("outcome", ""), "preempted") << ended->body;
  fs::remove_all(root);
}

}  // namespace
}  // namespace yolo8
