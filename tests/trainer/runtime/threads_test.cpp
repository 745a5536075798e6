#include "trainer/runtime/threads.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <string>

namespace yolo8 {
namespace {

// Checkpoints are encoded in the background only where a core is free for the writer's thread.
TEST(EncodeCheckpointsInBackground, OnlyWithACoreFreeOfComputeThreads) {
  CpuShare share;
  share.cores = 2;
  EXPECT_FALSE(encode_checkpoints_in_background(false, 2, share));
  EXPECT_FALSE(encode_checkpoints_in_background(false, 3, share));
  EXPECT_TRUE(encode_checkpoints_in_background(false, 1, share));
  EXPECT_TRUE(encode_checkpoints_in_background(true, 2, share));
  share.cores = 16;
  EXPECT_TRUE(encode_checkpoints_in_background(false, 8, share));
  EXPECT_FALSE(encode_checkpoints_in_background(false, 16, share));
}

// What deterministic=true means (trainer/runtime/threads.h), read back from LibTorch's context.
TEST(Determinism, TrueTurnsOnDeterministicKernelsAndTheCublasWorkspaceWithoutTheNanFill) {
  unsetenv("CUBLAS_WORKSPACE_CONFIG");
  configure_determinism(true);
  EXPECT_TRUE(at::globalContext().deterministicAlgorithms());
  EXPECT_TRUE(at::globalContext().deterministicAlgorithmsWarnOnly());
  EXPECT_TRUE(at::globalContext().deterministicCuDNN());
  EXPECT_FALSE(at::globalContext().benchmarkCuDNN());
  EXPECT_FALSE(at::globalContext().deterministicFillUninitializedMemory());
  ASSERT_NE(std::getenv("CUBLAS_WORKSPACE_CONFIG"), nullptr);
  EXPECT_EQ(std::string(std::getenv("CUBLAS_WORKSPACE_CONFIG")), ":4096:8");

  configure_determinism(false);
  EXPECT_FALSE(at::globalContext().deterministicAlgorithms());
  EXPECT_FALSE(at::globalContext().deterministicCuDNN());
}

TEST(Determinism, AWorkspaceTheUserSetIsKept) {
  setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8", 1);
  configure_determinism(true);
  EXPECT_EQ(std::string(std::getenv("CUBLAS_WORKSPACE_CONFIG")), ":16:8");
  unsetenv("CUBLAS_WORKSPACE_CONFIG");
  configure_determinism(false);
}

// On CPU the switch does not change the bits: the same seeded computation gives the same result both ways.
TEST(Determinism, CpuResultsAreTheSameBitsEitherWay) {
  auto run = [](bool deterministic) {
    configure_determinism(deterministic);
    torch::manual_seed(3);
    torch::Tensor x = torch::randn({4, 8, 16, 16}, torch::requires_grad());
    torch::Tensor w = torch::randn({8, 8, 3, 3});
    torch::Tensor y = torch::upsample_nearest2d(torch::conv2d(x, w, {}, 1, 1), std::vector<int64_t>{32, 32});
    y.sum().backward();
    return x.grad().clone();
  };
  const torch::Tensor a = run(true);
  const torch::Tensor b = run(false);
  EXPECT_TRUE(torch::equal(a, b));
}

}  // namespace
}  // namespace yolo8
