// Clock steps on the real `quotad serve`: the process runs under libfaketime (Debian's `faketime`), whose
// wall clock follows a file we rewrite while it serves ("+0", then "-2h" or "+2h"), while its monotonic clock runs
// on (FAKETIME_DONT_FAKE_MONOTONIC), as with an NTP step. Skipped where libfaketime is not installed.
#include <httplib.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/quota/quota_test_util.h"
#include "tests/quota/quotad_process.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;
using Steady = std::chrono::steady_clock;

// libfaketime's thread-safe preload library where Debian and Ubuntu install it; "" when missing.
std::string libfaketime() {
  for (const char* path :
       {"/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1", "/usr/lib/faketime/libfaketimeMT.so.1"}) {
    if (std::filesystem::exists(path)) return path;
  }
  return "";
}

// Two GPUs, ttl 6 s; alice holds leases, admin reads the audit log.
const char* kPolicy = R"(
inventory:
  nodes: [{name: box, gpus: 2, memory_gib: 24}]
emergency_pool: 0
users:
  alice: {token_sha256: 9c220f200955d76c0a38d308225e0ef10c5f971acaf2f8d1d8f732affa5bd1dc}
  admin: {role: admin, token_sha256: 10a4c7c9fc5206d6f36dc6944a81bb6f4a3cb0e25014ae3b12e6c3e52712292a}
teams:
  t: {base: 2, burst: 2, members: [alice]}
credits: {monthly_gpu_hours: 0}
leases: {ttl_s: 6, heartbeat_interval_s: 2, expiry_grace_s: 0}
)";

class QuotadUnderFaketime : public ::testing::Test {
 protected:
  void SetUp() override {
    library_ = libfaketime();
    if (library_.empty()) GTEST_SKIP() << "libfaketime is not installed (Debian package faketime)";
    root_ = std::filesystem::path(testing::temp_db("faketime")).replace_extension("");
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
    offset_file_ = (root_ / "faketime.rc").string();
    set_offset("+0");
    std::ofstream(root_ / "policy.yaml") << kPolicy;
    ASSERT_TRUE(quotad_.start((root_ / "policy.yaml").string(), (root_ / "quota.db").string(),
                              (root_ / "quotad.log").string(), {},
                              {"LD_PRELOAD=" + library_, "FAKETIME_TIMESTAMP_FILE=" + offset_file_,
                               "FAKETIME_NO_CACHE=1", "FAKETIME_DONT_FAKE_MONOTONIC=1"}))
        << "quotad did not start under libfaketime; see " << (root_ / "quotad.log").string();
    client_ = std::make_unique<httplib::Client>("127.0.0.1", quotad_.port());
    client_->set_read_timeout(5, 0);
  }
  void TearDown() override {
    if (!library_.empty()) {
      EXPECT_TRUE(quotad_.stop());
    }
  }
  // libfaketime rereads the file at every clock call (FAKETIME_NO_CACHE): the step happens on the rename.
  void set_offset(const std::string& offset) {
    const std::string next = offset_file_ + ".next";
    std::ofstream(next) << offset << "\n";
    std::filesystem::rename(next, offset_file_);
  }
  json call(const std::string& method, const std::string& path, const std::string& token = "alice-token",
            const std::string& body = "{}") {
    const httplib::Headers auth{{"Authorization", "Bearer " + token}};
    auto answer = method == "GET" ? client_->Get(path.c_str(), auth)
                                  : client_->Post(path.c_str(), auth, body, "application/json");
    EXPECT_TRUE(answer) << method << " " << path;
    if (!answer) return json::object();
    EXPECT_LT(answer->status, 300) << method << " " << path << ": " << answer->body;
    return json::parse(answer->body);
  }
  int64_t acquire(int gpus) {
    return call("POST", "/v1/leases", "alice-token", R"({"gpus":)" + std::to_string(gpus) + "}")["lease_id"];
  }
  std::string beat(int64_t id) {
    return call("POST", "/v1/leases/" + std::to_string(id) + "/heartbeat")["state"].get<std::string>();
  }
  std::string state(int64_t id) { return call("GET", "/v1/leases/" + std::to_string(id))["state"]; }
  int audited(const std::string& action) {
    int count = 0;
    const json answer = call("GET", "/v1/audit?limit=1000", "admin-token");
    for (const json& entry : answer["audit"]) {
      count += entry["action"] == action ? 1 : 0;
    }
    return count;
  }

  std::string library_;
  std::filesystem::path root_;
  std::string offset_file_;
  yolo8::test::QuotadProcess quotad_;
  std::unique_ptr<httplib::Client> client_;
};

// Before the fix a lease without heartbeats was still held 20 s after a 2 h backward step (ttl 6 s): expiry went
// by wall-clock differences, so a dead job would have kept its GPUs for 2 h.
TEST_F(QuotadUnderFaketime, AfterA2hStepBackALeaseWithoutHeartbeatsExpiresWithinItsTtl) {
  const int64_t silent = acquire(1);
  const int64_t alive = acquire(1);
  for (int i = 0; i < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    EXPECT_EQ(beat(silent), "granted");
    EXPECT_EQ(beat(alive), "granted");
  }
  const auto step = Steady::now();
  set_offset("-2h");  // and the silent lease's job dies with it
  double expired_after_s = -1;
  while (std::chrono::duration<double>(Steady::now() - step).count() < 15) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    EXPECT_EQ(beat(alive), "granted");
    if (state(silent) == "expired") {
      expired_after_s = std::chrono::duration<double>(Steady::now() - step).count();
      break;
    }
  }
  EXPECT_GT(expired_after_s, 0) << "still held 15 s after the step (ttl 6 s)";
  EXPECT_LE(expired_after_s, 6 + 2) << "its last heartbeat was before the step: ttl 6 s, ticks of 1 s";
  EXPECT_EQ(state(alive), "granted");
  EXPECT_EQ(audited("clock.step"), 1);
}

// Before the fix an 8-GPU lease was billed 16 GPU-hours for 6 s across a 2 h forward step; here 2 GPUs for
// about 7 s (a bill of the step would be 4 GPU-hours).
TEST_F(QuotadUnderFaketime, AfterA2hStepForwardALeaseIsBilledItsRealSeconds) {
  const auto start = Steady::now();
  const int64_t id = acquire(2);
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    EXPECT_EQ(beat(id), "granted");
  }
  set_offset("+2h");
  for (int i = 0; i < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    EXPECT_EQ(beat(id), "granted") << "expired by the step";
  }
  const json released =
      call("POST", "/v1/leases/" + std::to_string(id) + "/release", "alice-token", R"({"outcome":"completed"})");
  const double real_s = std::chrono::duration<double>(Steady::now() - start).count();
  EXPECT_EQ(released["state"], "released");
  const double gpu_hours = released["gpu_hours"].get<double>();
  EXPECT_GT(gpu_hours, 2 * (real_s - 2) / 3600) << "real time: " << real_s << " s";
  EXPECT_LT(gpu_hours, 2 * (real_s + 2) / 3600) << "real time: " << real_s << " s";
  EXPECT_EQ(audited("clock.step"), 1);
}

}  // namespace
}  // namespace yolo8::quota
