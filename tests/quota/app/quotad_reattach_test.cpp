// Grant receipts end to end with the real binary: a backup, five leases granted after it to running holders (the
// quota client, heartbeating as a trainer does), quotad killed, its database restored from the backup by
// `repair-db` and quotad started again on the same port. No id is reused, every holder re-attaches its lease from
// its receipt (same id and GPUs) and releases it at the end as a finished run does, `audit --verify` reports the
// restore's gap and the audit log has one `lease.reattach` entry per lease. The same with a real `yolo8 train`
// run (on the CPU) among the holders: it trains on through the restore and exits 0.
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "quota/client/client.h"
#include "tests/quota/quota_test_util.h"
#include "tests/quota/quotad_process.h"
#include "tests/trainer/process_util.h"

namespace yolo8::quota {
namespace {

namespace fs = std::filesystem;
using testing::read_text;
using yolo8::test::run_quotad;

// The example policy with a heartbeat every second and a ttl of 20 s: the restore fits well inside the ttl.
std::string fast_policy() {
  std::string text = read_text(testing::example_policy_path());
  const std::string leases = "leases: {ttl_s: 60, heartbeat_interval_s: 10, expiry_grace_s: 30}";
  const auto at = text.find(leases);
  if (at == std::string::npos) return "";
  return text.replace(at, leases.size(), "leases: {ttl_s: 20, heartbeat_interval_s: 1, expiry_grace_s: 5}");
}

ClientConfig holder_config(const std::string& url, const std::string& user) {
  ClientConfig config;
  config.mode = url;
  config.token = user + "-token";
  config.unavailable_deadline_s = 30;
  config.on_notice = [](const std::string&) {};
  return config;
}

TEST(QuotadReattach, FiveRunningLeasesARestoreLostComeBackFromTheirReceipts) {
  const fs::path dir = fs::path(yolo8::test::kBinaryDir) / "quota_test_tmp" / "reattach";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(fs::path(testing::example_policy_path()).parent_path() / "memory-table.yaml",
                dir / "memory-table.yaml");
  const std::string policy_text = fast_policy();
  ASSERT_FALSE(policy_text.empty()) << "the example policy's leases line changed";
  std::ofstream(dir / "policy.yaml") << policy_text;
  const std::string policy = (dir / "policy.yaml").string();
  const std::string db = (dir / "quota.db").string();
  const std::string log = (dir / "quotad.log").string();
  const std::string out = (dir / "command.out").string();
  const std::vector<std::string> no_backups = {"--backup-every", "0"};

  auto quotad = std::make_unique<yolo8::test::QuotadProcess>();
  ASSERT_TRUE(quotad->start(policy, db, log, no_backups)) << read_text(log);
  const std::string url = quotad->url();
  const int port = quotad->port();
  ASSERT_EQ(run_quotad({"backup", "--db", db}, out), 0) << read_text(out);

  const std::vector<std::string> users = {"alice", "bob", "erin", "alice", "ivan"};
  std::vector<std::unique_ptr<QuotaClient>> holders;
  std::vector<LeaseInfo> granted;
  for (size_t i = 0; i < users.size(); ++i) {
    auto client = std::make_unique<QuotaClient>(holder_config(url, users[i]));
    LeaseRequest request;
    request.model = "yolov8n";
    request.job = "run-" + std::to_string(i);
    request.gpus = 1;
    granted.push_back(client->acquire(request));
    ASSERT_TRUE(granted.back().receipt.is_object()) << "the grant carries its receipt";
    client->start_heartbeats();
    holders.push_back(std::move(client));
  }
  ASSERT_EQ(granted.back().id, 5);

  quotad->kill_hard();  // a crash; then the database is gone
  for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(db + suffix);
  ASSERT_EQ(run_quotad({"repair-db", "--db", db}, out), 0) << read_text(out);
  // the backup holds no lease: the new epoch starts at the first multiple of kIdEpochSpan
  EXPECT_NE(read_text(out).find("ids continue at 1000000000"), std::string::npos) << read_text(out);
  quotad = std::make_unique<yolo8::test::QuotadProcess>("127.0.0.1:" + std::to_string(port));
  ASSERT_TRUE(quotad->start(policy, db, log, no_backups)) << read_text(log);

  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  auto all_back = [&] {
    for (const auto& holder : holders) {
      if (holder->reattachments() != 1) return false;
    }
    return true;
  };
  while (!all_back() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(all_back()) << read_text(log);
  std::this_thread::sleep_for(std::chrono::seconds(2));  // heartbeats go on on the re-attached leases

  httplib::Client http(url);
  const httplib::Headers admin = {{"Authorization", "Bearer admin-token"}};
  for (size_t i = 0; i < holders.size(); ++i) {
    EXPECT_FALSE(holders[i]->lost()) << i;
    const auto view = http.Get(("/v1/leases/" + std::to_string(granted[i].id)).c_str(), admin);
    ASSERT_TRUE(view && view->status == 200) << i;
    const nlohmann::json lease = nlohmann::json::parse(view->body);
    EXPECT_EQ(lease["state"], "granted") << i;
    EXPECT_EQ(lease["devices"].get<std::vector<std::string>>(), granted[i].devices) << i;
  }
  // a new grant takes an id of the new epoch
  const auto fresh = http.Post("/v1/leases", {{"Authorization", "Bearer bob-token"}},
                               R"({"model":"yolov8n","gpus":1,"job":"after"})", "application/json");
  ASSERT_TRUE(fresh && fresh->status == 201);
  EXPECT_EQ(nlohmann::json::parse(fresh->body)["lease"]["id"], 1000000000);
  // the runs finish: released, acknowledged, billed
  for (size_t i = 0; i < holders.size(); ++i) {
    const ReleaseAnswer answer = holders[i]->release(Outcome::kCompleted);
    EXPECT_TRUE(answer.acknowledged) << i << ": " << answer.reason;
    EXPECT_TRUE(answer.released_now) << i;
  }
  const auto audit = http.Get("/v1/audit?limit=1000", admin);
  ASSERT_TRUE(audit && audit->status == 200);
  int reattached = 0;
  const nlohmann::json entries = nlohmann::json::parse(audit->body)["audit"];
  for (const nlohmann::json& entry : entries) {
    if (entry["action"] != "lease.reattach") continue;
    ++reattached;
    EXPECT_NE(entry["detail"].get<std::string>().find("billed from the grant"), std::string::npos) << entry.dump();
  }
  EXPECT_EQ(reattached, 5) << audit->body;
  EXPECT_TRUE(quotad->stop());

  ASSERT_EQ(run_quotad({"audit", "--verify", "--db", db}, out), 0) << read_text(out);
  EXPECT_NE(read_text(out).find("chain intact"), std::string::npos) << read_text(out);
  EXPECT_NE(read_text(out).find("recorded gap: entries "), std::string::npos) << read_text(out);
  fs::remove_all(dir);
}

// Waits until `log` holds `text`; false at `limit_s` or when the child exited first.
bool wait_for_text(pid_t child, const fs::path& log, const std::string& text, double limit_s) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int64_t>(limit_s * 1000));
  while (std::chrono::steady_clock::now() < until) {
    if (read_text(log.string()).find(text) != std::string::npos) return true;
    int status = 0;
    if (waitpid(child, &status, WNOHANG) == child) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// The trainer's side needs nothing but the client: its heartbeats meet "unknown lease", the client presents the
// receipt, and the run never learns its lease was lost.
TEST(QuotadReattach, ARealTrainingRunTrainsOnThroughTheRestoreAndExitsZero) {
  const fs::path yolo8 = fs::path(yolo8::test::kBinaryDir) / "trainer" / "yolo8";
  if (!fs::exists(yolo8)) GTEST_SKIP() << yolo8 << " is not built (a LibTorch build)";
  const fs::path dir = fs::path(yolo8::test::kBinaryDir) / "quota_test_tmp" / "reattach_trainer";
  fs::remove_all(dir);
  fs::create_directories(dir);
  fs::copy_file(fs::path(testing::example_policy_path()).parent_path() / "memory-table.yaml",
                dir / "memory-table.yaml");
  std::ofstream(dir / "policy.yaml") << fast_policy();
  const std::string policy = (dir / "policy.yaml").string();
  const std::string db = (dir / "quota.db").string();
  const std::string log = (dir / "quotad.log").string();
  const std::string out = (dir / "command.out").string();
  const std::vector<std::string> no_backups = {"--backup-every", "0"};
  const pid_t synth = yolo8::test::spawn_yolo8(
      {"data", "synth", "out=" + (dir / "ds").string(), "train=16", "val=4", "imgsz=64", "seed=11"});
  int status = 0;
  ASSERT_EQ(waitpid(synth, &status, 0), synth);
  ASSERT_EQ(yolo8::test::exit_code_of(status), 0);

  auto quotad = std::make_unique<yolo8::test::QuotadProcess>();
  ASSERT_TRUE(quotad->start(policy, db, log, no_backups)) << read_text(log);
  const int port = quotad->port();
  ASSERT_EQ(run_quotad({"backup", "--db", db}, out), 0) << read_text(out);
  std::vector<std::unique_ptr<QuotaClient>> holders;
  for (const std::string user : {"bob", "erin", "alice", "ivan"}) {
    holders.push_back(std::make_unique<QuotaClient>(holder_config(quotad->url(), user)));
    LeaseRequest request;
    request.model = "yolov8n";
    request.job = user + "-run";
    holders.back()->acquire(request);
    holders.back()->start_heartbeats();
  }
  const fs::path train_log = dir / "train.log";
  const pid_t trainer = yolo8::test::spawn_yolo8(
      {"train", "data=" + (dir / "ds" / "data.yaml").string(), "model=yolov8n.yaml", "imgsz=64", "batch=4", "epochs=12",
       "workers=1", "threads=1", "device=cpu", "val=false", "plots=false", "quota=" + quotad->url(), "team=team-cv",
       "user=alice", "project=" + (dir / "runs").string(), "name=run"},
      {{"YOLO8_QUOTA_TOKEN", "alice-token"}}, train_log.string());
  ASSERT_TRUE(wait_for_text(trainer, train_log, "Lease 5 granted", 60)) << read_text(train_log.string());
  ASSERT_TRUE(wait_for_text(trainer, train_log, " box ", 60)) << read_text(train_log.string());  // training

  quotad->kill_hard();
  for (const char* suffix : {"", "-wal", "-shm"}) fs::remove(db + suffix);
  ASSERT_EQ(run_quotad({"repair-db", "--db", db}, out), 0) << read_text(out);
  quotad = std::make_unique<yolo8::test::QuotadProcess>("127.0.0.1:" + std::to_string(port));
  ASSERT_TRUE(quotad->start(policy, db, log, no_backups)) << read_text(log);
  EXPECT_TRUE(wait_for_text(trainer, train_log, "re-attached from the grant receipt", 20))
      << read_text(train_log.string());

  const auto since = std::chrono::steady_clock::now();
  int code = -1;
  while (std::chrono::steady_clock::now() - since < std::chrono::seconds(240)) {
    if (waitpid(trainer, &status, WNOHANG) == trainer) {
      code = yolo8::test::exit_code_of(status);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (code == -1) {
    ::kill(trainer, SIGKILL);
    waitpid(trainer, &status, 0);
  }
  const std::string train_text = read_text(train_log.string());
  EXPECT_EQ(code, 0) << train_text;
  EXPECT_NE(train_text.find("Lease 5 released (completed)"), std::string::npos) << train_text;
  for (const auto& holder : holders) {
    EXPECT_EQ(holder->reattachments(), 1);
    EXPECT_TRUE(holder->release(Outcome::kCompleted).acknowledged);
  }
  httplib::Client http(quotad->url());
  const auto audit = http.Get("/v1/audit?limit=1000", {{"Authorization", "Bearer admin-token"}});
  ASSERT_TRUE(audit && audit->status == 200);
  const nlohmann::json entries = nlohmann::json::parse(audit->body)["audit"];
  EXPECT_EQ(std::count_if(entries.begin(), entries.end(),
                          [](const nlohmann::json& entry) { return entry["action"] == "lease.reattach"; }),
            5)
      << audit->body;
  EXPECT_TRUE(quotad->stop());
  ASSERT_EQ(run_quotad({"audit", "--verify", "--db", db}, out), 0) << read_text(out);
  EXPECT_NE(read_text(out).find("recorded gap: entries "), std::string::npos) << read_text(out);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace yolo8::quota
