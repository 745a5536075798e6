// The CPU share read from a fake cgroup tree (v2 cpu.max at several levels, v1 cfs files) and an affinity count.
#include "trainer/runtime/cpu_share.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "trainer/runtime/threads.h"

namespace yolo8 {
namespace {
namespace fs = std::filesystem;

class CpuShareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(::testing::TempDir()) / ("yolo8_cgroup_" + std::to_string(getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void write(const fs::path& relative, const std::string& text) {
    fs::create_directories((root_ / relative).parent_path());
    std::ofstream(root_ / relative) << text;
  }
  fs::path root_;
};

TEST_F(CpuShareTest, NoCgroupFilesMeansTheAffinity) {
  const CpuShare share = cpu_share_from(root_.string(), "/", 128, 128);
  EXPECT_EQ(share.cores, 128);
  EXPECT_EQ(share.quota_cores, 0);
  EXPECT_FALSE(share.shared());
  EXPECT_NE(share.explain().find("no affinity or quota limit"), std::string::npos) << share.explain();
}

TEST_F(CpuShareTest, V2UnlimitedCpuMaxIsNoLimit) {
  write("cpu.max", "max 100000\n");
  EXPECT_EQ(cpu_share_from(root_.string(), "/", 16, 16).cores, 16);
}

// A pod limited to 8 CPUs on a 128-core GPU node.
TEST_F(CpuShareTest, V2QuotaOfAPodOnABigNode) {
  write("cpu.max", "800000 100000\n");
  const CpuShare share = cpu_share_from(root_.string(), "/", 128, 128);
  EXPECT_EQ(share.cores, 8);
  EXPECT_DOUBLE_EQ(share.quota_cores, 8.0);
  EXPECT_TRUE(share.shared());
  EXPECT_EQ(share.quota_source, (root_ / "cpu.max").string());
  EXPECT_NE(share.explain().find("8 of 128 cores"), std::string::npos) << share.explain();
  EXPECT_NE(share.explain().find("cgroup quota 8.00 cores"), std::string::npos) << share.explain();
}

// The smallest quota on the way from the process's cgroup to the root binds; a fraction rounds down.
TEST_F(CpuShareTest, V2NestedCgroupsTheSmallestQuotaWins) {
  write("kubepods/cpu.max", "1600000 100000\n");
  write("kubepods/pod1/cpu.max", "250000 100000\n");
  write("kubepods/pod1/ctr/cpu.max", "max 100000\n");
  const CpuShare share = cpu_share_from(root_.string(), "/kubepods/pod1/ctr", 64, 64);
  EXPECT_DOUBLE_EQ(share.quota_cores, 2.5);
  EXPECT_EQ(share.cores, 2);
  EXPECT_EQ(share.quota_source, (root_ / "kubepods" / "pod1" / "cpu.max").string());
}

TEST_F(CpuShareTest, QuotaUnderOneCoreStillRunsOneThread) {
  write("cpu.max", "50000 100000\n");
  EXPECT_EQ(cpu_share_from(root_.string(), "/", 4, 4).cores, 1);
}

TEST_F(CpuShareTest, V1CfsQuota) {
  write("cpu,cpuacct/cpu.cfs_quota_us", "400000\n");
  write("cpu,cpuacct/cpu.cfs_period_us", "100000\n");
  EXPECT_EQ(cpu_share_from(root_.string(), "/", 32, 32).cores, 4);
  write("cpu,cpuacct/cpu.cfs_quota_us", "-1\n");
  EXPECT_EQ(cpu_share_from(root_.string(), "/", 32, 32).cores, 32);
}

TEST_F(CpuShareTest, AffinityBelowTheQuotaWins) {
  write("cpu.max", "800000 100000\n");
  const CpuShare share = cpu_share_from(root_.string(), "/", 128, 3);
  EXPECT_EQ(share.cores, 3);
  EXPECT_NE(share.explain().find("affinity allows 3"), std::string::npos) << share.explain();
}

TEST_F(CpuShareTest, GarbledFilesLimitNothing) {
  write("cpu.max", "lots 100000\n");
  EXPECT_EQ(cpu_share_from(root_.string(), "/", 8, 8).cores, 8);
}

// Four ranks of one job in a pod limited to 8 CPUs share them: 2 compute threads and at most 2 loader workers
// each, said in the run log; a share smaller than the ranks still runs one thread per rank.
TEST_F(CpuShareTest, LocalRanksSplitTheShare) {
  write("cpu.max", "800000 100000\n");
  const CpuShare share = divide_among_local_ranks(cpu_share_from(root_.string(), "/", 128, 128), 4);
  EXPECT_EQ(share.cores, 2);
  EXPECT_EQ(share.local_ranks, 4);
  EXPECT_EQ(loader_workers(8, share), 2);
  EXPECT_NE(share.explain().find("2 of 128 cores"), std::string::npos) << share.explain();
  EXPECT_NE(share.explain().find("cgroup quota 8.00 cores"), std::string::npos) << share.explain();
  EXPECT_NE(share.explain().find("split among the 4 ranks on this node (LOCAL_WORLD_SIZE): 2 each"), std::string::npos)
      << share.explain();
  EXPECT_EQ(divide_among_local_ranks(cpu_share_from(root_.string(), "/", 128, 128), 3).cores, 2);  // rounds down
  EXPECT_EQ(divide_among_local_ranks(cpu_share_from(root_.string(), "/", 128, 128), 16).cores, 1);
  // one rank per node (an indexed Job's pods): nothing split, nothing said
  const CpuShare alone = divide_among_local_ranks(cpu_share_from(root_.string(), "/", 128, 128), 1);
  EXPECT_EQ(alone.cores, 8);
  EXPECT_EQ(alone.explain().find("split"), std::string::npos) << alone.explain();
}

TEST(LocalRanks, FromLocalWorldSize) {
  EXPECT_EQ(local_ranks_from(nullptr), 1);
  EXPECT_EQ(local_ranks_from(""), 1);
  EXPECT_EQ(local_ranks_from("4"), 4);
  for (const char* bad : {"0", "-2", "four", "2.5", "99999999999"}) {
    try {
      local_ranks_from(bad);
      ADD_FAILURE() << "accepted LOCAL_WORLD_SIZE=" << bad;
    } catch (const std::invalid_argument& error) {
      EXPECT_NE(std::string(error.what()).find("LOCAL_WORLD_SIZE"), std::string::npos) << error.what();
    }
  }
}

TEST(LoaderWorkers, CappedToTheShare) {
  CpuShare share;
  share.host_cores = 128;
  share.cores = 4;
  EXPECT_EQ(loader_workers(8, share), 4);
  EXPECT_EQ(loader_workers(2, share), 2);
  EXPECT_EQ(loader_workers(0, share), 0);  // workers=0: the main thread loads
}

// The real share of this test process: at least one core, never more than the host has.
TEST(CpuShareCurrent, WithinTheHost) {
  const CpuShare share = current_cpu_share();
  EXPECT_GE(share.cores, 1);
  EXPECT_LE(share.cores, share.host_cores);
}

}  // namespace
}  // namespace yolo8
