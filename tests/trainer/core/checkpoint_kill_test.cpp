// kill -9 while checkpoints are being written never leaves an unreadable file at the checkpoint path.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <random>

#include "trainer/core/checkpoint.h"

namespace yolo8 {
namespace {

namespace fs = std::filesystem;

size_t temporaries(const fs::path& dir) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind(".last.pt.tmp.", 0) == 0) ++n;
  }
  return n;
}

TEST(CheckpointKill, SigkillDuringWritesNeverCorruptsTheCheckpoint) {
  const fs::path dir = fs::temp_directory_path() / ("yolo8_kill_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string path = (dir / "last.pt").string();

  // 8 MiB of weights so that a write takes long enough to be interrupted.
  torch::nn::Linear model(1024, 2048);
  auto fill = [&](float v) {
    float* w = model->weight.data_ptr<float>();
    std::fill(w, w + model->weight.numel(), v);
  };
  CheckpointState state;
  fill(0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  save_checkpoint(path, state, {model.get()});
  const auto save_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0);
  std::cout << "one 8 MiB checkpoint save: " << save_us.count() / 1000.0 << " ms\n";

  // Kill times spread over about four writes, so that some rounds see completed writes and most a write in flight.
  std::mt19937 rng(20261130);
  std::uniform_int_distribution<int64_t> delay_us(0, 4 * std::max<int64_t>(save_us.count(), 1000));
  int interrupted_writes = 0;
  int64_t max_epoch_seen = 0;
  for (int round = 0; round < 20; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      // Child: rewrite the checkpoint as fast as possible, each time with new content.
      const auto start = std::chrono::steady_clock::now();
      for (int64_t k = 1; std::chrono::steady_clock::now() - start < std::chrono::seconds(10); ++k) {
        try {
          state.epoch = 1000 * (round + 1) + k;
          fill(static_cast<float>(state.epoch));
          save_checkpoint(path, state, {model.get()});
        } catch (...) {
          ::_exit(3);
        }
      }
      ::_exit(0);
    }
    ::usleep(static_cast<useconds_t>(delay_us(rng)));
    ASSERT_EQ(::kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(::waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "writer exited on its own with status " << status;
    if (temporaries(dir) > 0) ++interrupted_writes;

    std::string error;
    ASSERT_TRUE(checkpoint_readable(path, &error)) << "round " << round << ": " << error;
    torch::nn::Linear loaded(1024, 2048);
    CheckpointTargets targets;
    targets.model = loaded.get();
    const auto got = load_checkpoint(path, targets);
    // Weights and counters come from the same write.
    EXPECT_TRUE(torch::all(loaded->weight == static_cast<float>(got.epoch)).item<bool>()) << "round " << round;
    max_epoch_seen = std::max(max_epoch_seen, got.epoch);
  }
  EXPECT_GT(max_epoch_seen, 0);  // some writes completed
  // Most kills land inside a write (a temporary is left); at least some must have.
  EXPECT_GE(interrupted_writes, 1);
  RecordProperty("interrupted_writes", interrupted_writes);
  std::cout << "kills that interrupted a write: " << interrupted_writes << " of 20\n";

  // The next save removes the dead writers' temporaries.
  save_checkpoint(path, state, {model.get()});
  EXPECT_EQ(temporaries(dir), 0u);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace yolo8
