// Two `yolo8 train` processes over Gloo on loopback (as torchrun or an indexed Job would start them): they
// train together, rank 0 writes (and prints) the run, and a SIGTERM to rank 1 alone stops both at the same step.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <thread>

#include "common/exit_codes.h"
#include "data/synth.h"
#include "tests/trainer/process_util.h"
#include "trainer/core/checkpoint.h"
#include "trainer/core/distributed.h"
#include "trainer/run/launcher.h"

namespace yolo8 {
namespace {
namespace fs = std::filesystem;

pid_t spawn_rank(const std::vector<std::string>& args, int rank, int port, const std::string& stdout_path) {
  const std::map<std::string, std::string> env{
      {"RANK", std::to_string(rank)}, {"LOCAL_RANK", std::to_string(rank)},  {"WORLD_SIZE", "2"},
      {"MASTER_ADDR", "127.0.0.1"},   {"MASTER_PORT", std::to_string(port)}, {"YOLO8_DIST_TIMEOUT", "120"}};
  return test::spawn_yolo8(args, env, stdout_path);
}

using test::read_text;

int wait_exit(pid_t child) {
  int status = 0;
  waitpid(child, &status, 0);
  return test::exit_code_of(status);
}

TEST(DdpTrain, TwoProcessesTrainAndStopTogether) {
  const fs::path root = fs::path(::testing::TempDir()) / ("yolo8_ddp_train_" + std::to_string(getpid()));
  fs::remove_all(root);
  data::synthesize_dataset((root / "ds").string(), 16, 4, 64, 9);
  const auto args = [&](const std::string& name, int epochs) {
    return std::vector<std::string>{"train",
                                    "data=" + (root / "ds" / "data.yaml").string(),
                                    "model=yolov8n.yaml",
                                    "imgsz=64",
                                    "batch=8",
                                    "epochs=" + std::to_string(epochs),
                                    "workers=1",
                                    "threads=1",
                                    "device=cpu",
                                    "quota=off",
                                    "project=" + (root / "runs").string(),
                                    "name=" + name,
                                    "exist_ok=true",
                                    "resume=auto",
                                    "plots=false"};
  };
  {
    const int port = find_free_port();
    const pid_t rank0 = spawn_rank(args("together", 2), 0, port, (root / "rank0.log").string());
    const pid_t rank1 = spawn_rank(args("together", 2), 1, port, (root / "rank1.log").string());
    EXPECT_EQ(wait_exit(rank0), kExitCompleted);
    EXPECT_EQ(wait_exit(rank1), kExitCompleted);
    EXPECT_TRUE(checkpoint_readable((root / "runs/together/weights/last.pt").string()));
    EXPECT_TRUE(fs::exists(root / "runs/together/results.csv"));
    // Rank 0 prints the run (settings, progress, cost); rank 1 prints nothing of it.
    const std::string rank0_log = read_text(root / "rank0.log");
    EXPECT_NE(rank0_log.find("Cost:"), std::string::npos) << rank0_log;
    EXPECT_NE(rank0_log.find("1/2 "), std::string::npos) << rank0_log;
    EXPECT_EQ(read_text(root / "rank1.log"), "");
  }
  {
    // Only rank 1 gets SIGTERM (once rank 0 has finished epoch 1); rank 0 must stop at the same step and save.
    const int port = find_free_port();
    const fs::path last = root / "runs/stopped/weights/last.pt";
    const pid_t rank0 = spawn_rank(args("stopped", 50), 0, port, "/dev/null");
    const pid_t rank1 = spawn_rank(args("stopped", 50), 1, port, "/dev/null");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
    while (!fs::exists(last) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_TRUE(fs::exists(last)) << "epoch 1 never ended";
    kill(rank1, SIGTERM);
    EXPECT_EQ(wait_exit(rank0), kExitPreempted);
    EXPECT_EQ(wait_exit(rank1), kExitPreempted);
    const CheckpointState state = load_checkpoint(last.string());
    EXPECT_GE(state.global_iteration, 2);    // after epoch 1 (2 steps of 8 images)
    EXPECT_LT(state.global_iteration, 100);  // before the 50 epochs ended
  }
}

}  // namespace
}  // namespace yolo8
