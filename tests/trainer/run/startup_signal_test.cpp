// SIGTERM in every phase of a real `yolo8 train` process's start-up: while it sizes its batch (batch=-1), while
// its lease request waits in a full quotad's queue, while its dataset check is stuck on an image. Kubernetes
// preempts a pod exactly then. The first signal must end the run with exit 75 within a few seconds, not after the
// phase and a first step, and leave nothing behind in quotad.
#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include "common/exit_codes.h"
#include "data/synth.h"
#include "tests/quota/quotad_process.h"
#include "tests/trainer/process_util.h"

namespace yolo8 {
namespace {
namespace fs = std::filesystem;

using test::read_text;

TEST(StartupSignal, SigtermWhileSizingTheBatchExits75WithinSeconds) {
  const fs::path root = fs::path(::testing::TempDir()) / ("yolo8_startup_signal_" + std::to_string(getpid()));
  fs::remove_all(root);
  data::synthesize_dataset((root / "ds").string(), 16, 4, 64, 7);
  const fs::path log = root / "stdout.txt";
  // imgsz 640 on one thread: the whole sizing (trial steps up to batch 16, validation at 32) takes minutes and one
  // trial step several seconds (6.6 s for batch 2 on a loaded machine), longer than the bound asserted below.
  const pid_t child =
      test::spawn_yolo8({"train", "data=" + (root / "ds" / "data.yaml").string(), "model=yolov8n.yaml", "imgsz=640",
                         "batch=-1", "epochs=1", "workers=1", "threads=1", "quota=off",
                         "project=" + (root / "runs").string(), "name=sizing", "val=false", "plots=false"},
                        {}, log.string());
  int status = 0;
  const auto launched = std::chrono::steady_clock::now();
  bool sizing = false;
  while (!sizing && std::chrono::steady_clock::now() - launched < std::chrono::seconds(120)) {
    ASSERT_NE(waitpid(child, &status, WNOHANG), child) << "exited before sizing:\n" << read_text(log);
    // The first trial step's line: the sizing is under way (its handlers were installed long before).
    sizing = read_text(log).find("auto-batch: batch 1 ") != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(sizing) << read_text(log);
  const auto signalled = std::chrono::steady_clock::now();
  kill(child, SIGTERM);
  ASSERT_EQ(waitpid(child, &status, 0), child);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - signalled).count();
  std::cout << "exit " << test::exit_code_of(status) << " " << seconds << " s after SIGTERM during auto-batch sizing\n";
  const std::string out = read_text(log);
  EXPECT_EQ(test::exit_code_of(status), kExitPreempted) << out;
  EXPECT_LT(seconds, 5.0) << out;
  // Either the next trial step's check or, when the step under way is long, the set-up watchdog ended it (the
  // latter says so on stderr); training never began.
  EXPECT_EQ(out.find("Training yolov8n"), std::string::npos) << out;
  // No training step ran: nothing was checkpointed.
  EXPECT_FALSE(fs::exists(root / "runs" / "detect" / "sizing" / "weights" / "last.pt")) << out;
  EXPECT_FALSE(fs::exists(root / "runs" / "sizing" / "weights" / "last.pt")) << out;
  fs::remove_all(root);
}

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// One GPU; bob's high-priority lease holds it, so alice's low-priority request queues behind it.
constexpr const char* kOneGpuPolicy = R"(
inventory:
  nodes:
    - {name: n1, gpus: 1, memory_gib: 24}
emergency_pool: 0
users:
  admin: {role: admin, token_sha256: 10a4c7c9fc5206d6f36dc6944a81bb6f4a3cb0e25014ae3b12e6c3e52712292a}
  alice: {token_sha256: 9c220f200955d76c0a38d308225e0ef10c5f971acaf2f8d1d8f732affa5bd1dc}
  bob: {token_sha256: 97dd3707015dcf069cf73022ed7173b1165db6eff24b441cb57fd069a8c4e525}
teams:
  ta: {base: 1, burst: 1, members: [alice, bob]}
credits: {monthly_gpu_hours: 0}
leases: {ttl_s: 60, heartbeat_interval_s: 1}
tiers: {self_service: [yolov8n]}
)";

httplib::Headers bearer(const std::string& token) { return {{"Authorization", "Bearer " + token}}; }

// The leases quotad lists: the live ones, or those in `state`.
json leases(httplib::Client& client, const std::string& state = "") {
  auto response = client.Get(("/v1/leases" + (state.empty() ? "" : "?state=" + state)).c_str(), bearer("admin-token"));
  if (!response || response->status != 200) return json::array();
  const json body = json::parse(response->body, nullptr, false);
  return body.is_object() && body.contains("leases") ? body["leases"] : body;
}

struct Ended {
  int exit_code = -1;
  double seconds = 0;  // from the signal
};

// SIGTERM, then the exit within `limit_s` (SIGKILL after it: the test fails instead of hanging).
Ended terminate(pid_t child, double limit_s) {
  const auto signalled = Clock::now();
  kill(child, SIGTERM);
  int status = 0;
  Ended ended;
  for (;;) {
    ended.seconds = std::chrono::duration<double>(Clock::now() - signalled).count();
    if (waitpid(child, &status, WNOHANG) == child) break;
    if (ended.seconds > limit_s) {
      kill(child, SIGKILL);
      waitpid(child, &status, 0);
      ended.exit_code = -1;
      return ended;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ended.exit_code = test::exit_code_of(status);
  return ended;
}

std::vector<std::string> train_args(const fs::path& root, const std::string& quota_url) {
  return {"train",
          "data=" + (root / "ds" / "data.yaml").string(),
          "model=yolov8n.yaml",
          "imgsz=64",
          "batch=4",
          "epochs=1",
          "workers=1",
          "threads=1",
          "device=cpu",
          "val=false",
          "plots=false",
          "quota=" + quota_url,
          "team=ta",
          "user=alice",
          "priority=low",
          "project=" + (root / "runs").string(),
          "name=start"};
}

TEST(StartupSignal, SigtermWhileTheLeaseIsQueuedExits75AndCancelsTheRequest) {
  const fs::path root = fs::path(::testing::TempDir()) / ("yolo8_startup_queued_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  data::synthesize_dataset((root / "ds").string(), 8, 2, 64, 7);
  test::QuotadProcess quotad;
  ASSERT_TRUE(quotad.start_in(root, kOneGpuPolicy)) << read_text(root / "quotad.log");
  httplib::Client client("127.0.0.1", quotad.port());
  auto held =
      client.Post("/v1/leases", bearer("bob-token"),
                  R"({"team":"ta","job":"holder","model":"yolov8n","gpus":1,"priority":"high"})", "application/json");
  ASSERT_TRUE(held);
  ASSERT_EQ(held->status, 201) << held->body;

  const fs::path log = root / "stdout.txt";
  const pid_t child =
      test::spawn_yolo8(train_args(root, quotad.url()), {{"YOLO8_QUOTA_TOKEN", "alice-token"}}, log.string());
  bool queued = false;
  for (const auto until = Clock::now() + std::chrono::seconds(120); !queued && Clock::now() < until;) {
    int status = 0;
    ASSERT_NE(waitpid(child, &status, WNOHANG), child) << "exited before queueing:\n" << read_text(log);
    queued = read_text(log).find("waiting (queued") != std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_TRUE(queued) << read_text(log);
  std::optional<int64_t> request;
  for (const auto& lease : leases(client)) {
    if (lease["request"].value("user", "") == "alice" && lease.value("state", "") == "queued") {
      request = lease["id"].get<int64_t>();
    }
  }
  ASSERT_TRUE(request.has_value()) << leases(client).dump();

  const Ended ended = terminate(child, 20);
  std::cout << "exit " << ended.exit_code << " " << ended.seconds << " s after SIGTERM while the lease was queued\n";
  const std::string out = read_text(log);
  EXPECT_EQ(ended.exit_code, kExitPreempted) << out;
  EXPECT_LT(ended.seconds, 5.0) << out;
  EXPECT_EQ(out.find("Training yolov8n"), std::string::npos) << out;
  // The request gave up its place in the queue: it will not be granted to nobody.
  auto request_now = client.Get(("/v1/leases/" + std::to_string(*request)).c_str(), bearer("admin-token"));
  ASSERT_TRUE(request_now);
  const json lease = json::parse(request_now->body, nullptr, false);
  EXPECT_EQ(lease.value("state", ""), "released") << request_now->body;
  EXPECT_EQ(lease.value("outcome", ""), "cancelled") << request_now->body;
  EXPECT_TRUE(quotad.stop());
  fs::remove_all(root);
}

TEST(StartupSignal, SigtermWhileTheDatasetCheckIsStuckExits75) {
  const fs::path root = fs::path(::testing::TempDir()) / ("yolo8_startup_check_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  data::synthesize_dataset((root / "ds").string(), 8, 2, 64, 7);
  // The training split as a list whose last image is a FIFO nobody feeds: its read hangs like one on a hung
  // network filesystem. (A folder's listing skips anything but regular files; a list names the file.)
  {
    std::ofstream list(root / "ds" / "train.txt");
    for (const auto& entry : fs::directory_iterator(root / "ds" / "images" / "train")) {
      list << "images/train/" << entry.path().filename().string() << "\n";
    }
    list << "images/train/zz_hung.jpg\n";
  }
  const fs::path fifo = root / "ds" / "images" / "train" / "zz_hung.jpg";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0644), 0);
  std::string yaml = read_text(root / "ds" / "data.yaml");
  yaml.replace(yaml.find("train: images/train"), 19, "train: train.txt");
  std::ofstream(root / "ds" / "data.yaml") << yaml;
  test::QuotadProcess quotad;
  ASSERT_TRUE(quotad.start_in(root, kOneGpuPolicy)) << read_text(root / "quotad.log");

  const fs::path log = root / "stdout.txt";
  const pid_t child =
      test::spawn_yolo8(train_args(root, quotad.url()), {{"YOLO8_QUOTA_TOKEN", "alice-token"}}, log.string());
  // The check has opened the FIFO when a writer can open it without blocking; the writer stays open and silent,
  // so the check's read waits for bytes that never come.
  int writer = -1;
  for (const auto until = Clock::now() + std::chrono::seconds(120); writer < 0 && Clock::now() < until;) {
    int status = 0;
    ASSERT_NE(waitpid(child, &status, WNOHANG), child) << "exited before the check read the FIFO:\n" << read_text(log);
    writer = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer < 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(writer, 0) << read_text(log);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // inside the read, not between files

  const Ended ended = terminate(child, 20);
  ::close(writer);
  std::cout << "exit " << ended.exit_code << " " << ended.seconds << " s after SIGTERM during the dataset check\n";
  const std::string out = read_text(log);
  EXPECT_EQ(ended.exit_code, kExitPreempted) << out;
  EXPECT_LT(ended.seconds, 5.0) << out;
  EXPECT_EQ(out.find("Training yolov8n"), std::string::npos) << out;
  // The check comes before the lease: quotad was never asked, so nothing is left held there.
  httplib::Client client("127.0.0.1", quotad.port());
  EXPECT_TRUE(leases(client).empty()) << leases(client).dump();
  EXPECT_TRUE(leases(client, "released").empty()) << leases(client, "released").dump();
  EXPECT_TRUE(quotad.stop());
  fs::remove_all(root);
}

}  // namespace
}  // namespace yolo8
