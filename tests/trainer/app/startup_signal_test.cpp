// SIGTERM while a real `yolo8 train` process sizes its batch (batch=-1): Kubernetes preempts a pod exactly then.
// The first signal must end the run with exit 75 within a few seconds, not after the sizing and a first step.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

#include "data/synth.h"
#include "tests/trainer/process_util.h"
#include "trainer/core/exit_codes.h"

namespace yolo8 {
namespace {
namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

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

}  // namespace
}  // namespace yolo8
