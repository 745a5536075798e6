// A training run that stalls the way it does in production, end to end through a real quotad: one of its images
// becomes a FIFO nobody writes (a hung network filesystem), so the loader blocks reading it while the heartbeats
// go on. The utilisation quotad shows must drop to 0 within about one heartbeat interval instead of keeping the
// last figure, and a SIGTERM must still end the run with exit 75 and give the lease back.
#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
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
#include "trainer/core/checkpoint.h"

namespace yolo8 {
namespace {
namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

using test::read_text;

double seconds_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Heartbeats every second (the policy's interval, which the trainer follows), so the test stays short.
constexpr int kHeartbeatS = 1;
const std::string kPolicy = test::one_gpu_policy(30, kHeartbeatS);

httplib::Headers admin() { return {{"Authorization", "Bearer admin-token"}}; }

// What quotad says about the run's lease right now: the lease (null when unreadable) and the utilisation its
// /metrics shows with source="busy_time" (nullopt when that series is absent).
struct View {
  json lease;
  std::optional<double> busy_time_util;
};

View look(httplib::Client& client, int64_t lease_id) {
  View view;
  if (auto response = client.Get(("/v1/leases/" + std::to_string(lease_id)).c_str(), admin());
      response && response->status == 200) {
    view.lease = json::parse(response->body, nullptr, false);
  }
  if (auto metrics = client.Get("/metrics"); metrics && metrics->status == 200) {
    std::istringstream lines(metrics->body);
    const std::string lease_label = "lease=\"" + std::to_string(lease_id) + "\"";
    for (std::string line; std::getline(lines, line);) {
      if (line.rfind("quotad_lease_gpu_utilization{", 0) == 0 && line.find(lease_label) != std::string::npos &&
          line.find("source=\"busy_time\"") != std::string::npos) {
        view.busy_time_util = std::stod(line.substr(line.rfind(' ') + 1));
      }
    }
  }
  return view;
}

int64_t step_of(const View& view) {
  return view.lease.is_object() && view.lease.contains("telemetry") ? view.lease["telemetry"].value("step", int64_t{-1})
                                                                    : -1;
}

TEST(StalledRun, UtilisationDropsToZeroWithinAnIntervalAndSigtermStillExits75) {
  const fs::path root = fs::path(::testing::TempDir()) / ("yolo8_stalled_run_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  // 48 images, batch 4: the loader keeps the last 32 decoded (8 x batch), so every epoch reads at least 16 again.
  data::synthesize_dataset((root / "ds").string(), 48, 4, 64, 13);
  test::QuotadProcess quotad;
  ASSERT_TRUE(quotad.start_in(root, kPolicy)) << read_text(root / "quotad.log");
  const fs::path log = root / "train.log";
  // Many short epochs, each reading images the loader no longer holds: the swapped image leaves the held ones
  // within an epoch or two and is read again, and the stall comes.
  const pid_t child = test::spawn_yolo8(
      {"train", "data=" + (root / "ds" / "data.yaml").string(), "model=yolov8n.yaml", "imgsz=64", "batch=4",
       "epochs=1000", "workers=1", "threads=1", "device=cpu", "val=false", "plots=false", "quota=" + quotad.url(),
       "team=ta", "user=alice", "project=" + (root / "runs").string(), "name=stall"},
      {{"YOLO8_QUOTA_TOKEN", "alice-token"}}, log.string());
  const auto still_running = [&] {
    int status = 0;
    return waitpid(child, &status, WNOHANG) != child;
  };

  // Steps run: quotad shows the lease with a positive busy-time utilisation.
  httplib::Client client("127.0.0.1", quotad.port());
  int64_t lease_id = 0;
  View running;
  auto running_seen = Clock::now();
  for (const auto until = Clock::now() + std::chrono::seconds(180); Clock::now() < until;) {
    ASSERT_TRUE(still_running()) << read_text(log);
    if (lease_id == 0) {
      if (auto response = client.Get("/v1/leases", admin()); response && response->status == 200) {
        const json body = json::parse(response->body, nullptr, false);
        const json& list = body.is_object() && body.contains("leases") ? body["leases"] : body;
        for (const auto& lease : list) {
          if (lease.value("state", "") == "granted") lease_id = lease["id"].get<int64_t>();
        }
      }
    } else {
      running = look(client, lease_id);
      running_seen = Clock::now();
      if (step_of(running) >= 2 && running.busy_time_util.value_or(0) > 0) break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GT(lease_id, 0) << read_text(log) << read_text(root / "quotad.log");
  ASSERT_GT(running.busy_time_util.value_or(0), 0.0) << running.lease.dump() << "\n" << read_text(log);
  std::cout << "while steps run: utilisation " << *running.busy_time_util << " (busy_time) at step " << step_of(running)
            << "\n";

  // The stall: an image of the training split turns into a FIFO that nobody writes, as a read on a hung network
  // filesystem never returns. (The dataset check read the real image before training began.)
  const fs::path image = *fs::directory_iterator(root / "ds" / "images" / "train");
  ASSERT_TRUE(fs::is_regular_file(image));
  ASSERT_EQ(mkfifo((root / "hung.fifo").c_str(), 0644), 0);
  fs::rename(root / "hung.fifo", image);
  const auto stalled_from = Clock::now();

  // quotad's view every 100 ms: the step stops advancing; the utilisation drops to 0 and stays there.
  int64_t last_step = step_of(running);
  auto last_step_seen = running_seen;
  bool at_zero = false;
  Clock::time_point zero_at;
  View view;
  for (const auto until = Clock::now() + std::chrono::seconds(60); Clock::now() < until;) {
    ASSERT_TRUE(still_running()) << read_text(log);
    view = look(client, lease_id);
    if (step_of(view) != last_step) {
      last_step = step_of(view);
      last_step_seen = Clock::now();
      at_zero = false;  // a step finished after all: not stalled yet
    }
    if (view.busy_time_util && *view.busy_time_util == 0.0 && !at_zero) {
      at_zero = true;
      zero_at = Clock::now();
    }
    // Stalled for sure: 0 and no step for three more heartbeat intervals.
    if (at_zero && seconds_between(zero_at, Clock::now()) > 3 * kHeartbeatS) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(at_zero) << "utilisation never dropped to 0: " << view.lease.dump() << "\n" << read_text(log);
  EXPECT_EQ(view.busy_time_util.value_or(-1), 0.0) << view.lease.dump();
  EXPECT_EQ(view.lease.value("state", ""), "granted") << view.lease.dump();
  // The heartbeat that first carried the last step may still count part of that step (busy time is added when a
  // step ends); the next one, an interval later, must say 0.
  const double to_zero = seconds_between(last_step_seen, zero_at);
  std::cout << "stalled at step " << last_step << " (first shown " << seconds_between(stalled_from, last_step_seen)
            << " s from the swap); quotad showed utilisation 0 " << to_zero
            << " s after it first showed that step (heartbeat every " << kHeartbeatS << " s)\n";
  EXPECT_LE(to_zero, 2.0 * kHeartbeatS + 1.0);

  // Preempted while stalled: the first SIGTERM ends it with exit 75 within a few seconds, the lease given back.
  const auto signalled = Clock::now();
  kill(child, SIGTERM);
  int status = 0;
  bool exited = false;
  while (!exited && seconds_between(signalled, Clock::now()) < 20) {
    exited = waitpid(child, &status, WNOHANG) == child;
    if (!exited) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double seconds = seconds_between(signalled, Clock::now());
  if (!exited) {
    kill(child, SIGKILL);
    waitpid(child, &status, 0);
  }
  const std::string out = read_text(log);
  ASSERT_TRUE(exited) << "still running 20 s after SIGTERM while stalled:\n" << out;
  std::cout << "exit " << test::exit_code_of(status) << " " << seconds << " s after SIGTERM while stalled\n";
  EXPECT_EQ(test::exit_code_of(status), kExitPreempted) << out;
  EXPECT_LT(seconds, 5.0) << out;
  // One process: the state after its last step is checkpointed, as for any stop inside an epoch.
  EXPECT_NE(out.find("Stopped (signal) in epoch"), std::string::npos) << out;
  EXPECT_TRUE(checkpoint_readable((root / "runs" / "stall" / "weights" / "last.pt").string())) << out;
  const View ended = look(client, lease_id);
  EXPECT_EQ(ended.lease.value("state", ""), "released") << ended.lease.dump();
  EXPECT_EQ(ended.lease.value("outcome", ""), "preempted") << ended.lease.dump();
  fs::remove_all(root);
}

}  // namespace
}  // namespace yolo8
