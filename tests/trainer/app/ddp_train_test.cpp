// Two `yolo8 train` processes over Gloo on loopback (as torchrun or an indexed Job would start them): they
// train together, rank 0 writes the run, and a stop raised on rank 1 alone stops both at the same step.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "data/synth.h"
#include "tests/trainer/process_util.h"
#include "trainer/core/checkpoint.h"
#include "trainer/app/launcher.h"
#include "trainer/core/distributed.h"
#include "trainer/core/exit_codes.h"

namespace yolo8 {
namespace {
namespace fs = std::filesystem;

pid_t spawn_rank(const std::vector<std::string>& args, int rank, int port, const std::string& stop_at) {
  std::map<std::string, std::string> env{{"RANK", std::to_string(rank)},       {"LOCAL_RANK", std::to_string(rank)},
                                         {"WORLD_SIZE", "2"},                    {"MASTER_ADDR", "127.0.0.1"},
                                         {"MASTER_PORT", std::to_string(port)}, {"YOLO8_DIST_TIMEOUT", "120"}};
  if (!stop_at.empty()) env["YOLO8_TEST_STOP_AT_ITERATION"] = stop_at;
  return test::spawn_yolo8(args, env);
}

int wait_exit(pid_t child) {
  int status = 0;
  waitpid(child, &status, 0);
  return test::exit_code_of(status);
}

TEST(DdpTrain, TwoProcessesTrainAndStopTogether) {
  const fs::path root = fs::path(::testing::TempDir()) / ("yolo8_ddp_train_" + std::to_string(getpid()));
  fs::remove_all(root);
  data::synthesize_dataset((root / "ds").string(), 16, 4, 64, 9);
  const auto args = [&](const std::string& name) {
    return std::vector<std::string>{"train", "data=" + (root / "ds" / "data.yaml").string(), "model=yolov8n.yaml",
                                    "imgsz=64", "batch=8", "epochs=2", "workers=1", "threads=1", "device=cpu",
                                    "quota=off", "project=" + (root / "runs").string(), "name=" + name,
                                    "exist_ok=true", "resume=auto", "plots=false"};
  };
  {
    const int port = find_free_port();
    const pid_t rank0 = spawn_rank(args("together"), 0, port, "");
    const pid_t rank1 = spawn_rank(args("together"), 1, port, "");
    EXPECT_EQ(wait_exit(rank0), kExitCompleted);
    EXPECT_EQ(wait_exit(rank1), kExitCompleted);
    EXPECT_TRUE(checkpoint_readable((root / "runs/train/together/weights/last.pt").string()));
    EXPECT_TRUE(fs::exists(root / "runs/train/together/results.csv"));
  }
  {
    // Only rank 1 is told to stop (at its 3rd step); rank 0 must stop at the same step and save.
    const int port = find_free_port();
    const pid_t rank0 = spawn_rank(args("stopped"), 0, port, "");
    const pid_t rank1 = spawn_rank(args("stopped"), 1, port, "3");
    EXPECT_EQ(wait_exit(rank0), kExitPreempted);
    EXPECT_EQ(wait_exit(rank1), kExitPreempted);
    const CheckpointState state = load_checkpoint((root / "runs/train/stopped/weights/last.pt").string());
    EXPECT_EQ(state.global_iteration, 3);
  }
}

}  // namespace
}  // namespace yolo8
