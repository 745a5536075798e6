// SIGTERM at random moments of a real `yolo8 train` process: every stop exits 75 with a loadable checkpoint,
// and the chain of resumed runs ends with the weights of an uninterrupted run (CPU, deterministic).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "common/exit_codes.h"
#include "data/synth.h"
#include "tests/trainer/process_util.h"
#include "trainer/core/checkpoint.h"
#include "trainer/run/train_run.h"
#include "trainer/support/model_loading.h"

namespace yolo8 {
namespace {
namespace fs = std::filesystem;

struct Outcome {
  int exit_code = -1;
  bool signalled = false;
};

// True once `pid` catches SIGTERM (its handler is installed), read from /proc/PID/status.
bool catches_sigterm(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("SigCgt:", 0) == 0) {
      const unsigned long long mask = std::stoull(line.substr(7), nullptr, 16);
      return (mask >> (SIGTERM - 1)) & 1ULL;
    }
  }
  return false;
}

// Runs yolo8 train; sends SIGTERM `delay_s` after its handler is installed, if it is still running (delay < 0:
// never). Before that point a signal kills any program while the dynamic loader maps LibTorch, which takes
// longer than the shortest delay on a loaded machine.
Outcome run_yolo8(const std::vector<std::string>& args, double delay_s) {
  const pid_t child = test::spawn_yolo8(args);
  Outcome outcome;
  int status = 0;
  const auto launched = std::chrono::steady_clock::now();
  while (delay_s >= 0 && !catches_sigterm(child) &&
         std::chrono::steady_clock::now() - launched < std::chrono::seconds(60)) {
    if (waitpid(child, &status, WNOHANG) == child) {
      outcome.exit_code = test::exit_code_of(status);
      return outcome;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(delay_s);
  while (true) {
    const pid_t done = waitpid(child, &status, delay_s < 0 || outcome.signalled ? 0 : WNOHANG);
    if (done == child) break;
    if (!outcome.signalled && std::chrono::steady_clock::now() >= deadline) {
      kill(child, SIGTERM);
      outcome.signalled = true;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  outcome.exit_code = test::exit_code_of(status);
  return outcome;
}

TEST(Sigterm, TenRandomStopsThenSameWeightsAsUninterrupted) {
  const fs::path root = fs::path(::testing::TempDir()) / ("yolo8_sigterm_" + std::to_string(getpid()));
  fs::remove_all(root);
  data::synthesize_dataset((root / "ds").string(), 16, 4, 64, 5);
  const auto args = [&](const std::string& name) {
    return std::vector<std::string>{"train",
                                    "data=" + (root / "ds" / "data.yaml").string(),
                                    "model=yolov8n.yaml",
                                    "imgsz=64",
                                    "batch=4",
                                    "epochs=12",
                                    "workers=1",
                                    "threads=1",
                                    "quota=off",
                                    "project=" + (root / "runs").string(),
                                    "name=" + name,
                                    "exist_ok=true",
                                    "resume=auto",
                                    "val=false"};
  };
  const auto straight_start = std::chrono::steady_clock::now();
  ASSERT_EQ(run_yolo8(args("straight"), -1).exit_code, kExitCompleted);
  const double straight_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - straight_start).count();

  // Ten stops have to come before the chain completes, and a launch trains for at most its delay: the delays scale
  // with the uninterrupted run (3.5 s on a fast CPU, where 0.2-1.2 s let 4-7 launches finish it).
  std::mt19937 random(1234);
  std::uniform_real_distribution<double> delay(0.2, 0.2 + straight_s / 25);
  const fs::path last = root / "runs" / "chain" / "weights" / "last.pt";
  int stops = 0;
  int launches = 0;
  for (; launches < 60; ++launches) {
    const Outcome outcome = run_yolo8(args("chain"), stops < 10 ? delay(random) : -1);
    if (outcome.exit_code == kExitCompleted) break;
    ASSERT_TRUE(outcome.signalled) << "exit " << outcome.exit_code << " without a signal";
    ASSERT_EQ(outcome.exit_code, kExitPreempted) << "launch " << launches;
    std::string error;
    ASSERT_TRUE(checkpoint_readable(last.string(), &error)) << error;
    ++stops;
  }
  EXPECT_GE(stops, 10);
  ASSERT_LT(launches, 60);

  LoadedModel straight = load_any_model((root / "runs" / "straight" / "weights" / "last.pt").string());
  LoadedModel chain = load_any_model(last.string());
  const auto expected = state_dict(*straight.model);
  const auto actual = state_dict(*chain.model);
  ASSERT_EQ(expected.size(), actual.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_TRUE(torch::equal(expected[i].second.contiguous(), actual[i].second.contiguous()))
        << expected[i].first << " differs after " << stops << " SIGTERMs";
  }
}

}  // namespace
}  // namespace yolo8
