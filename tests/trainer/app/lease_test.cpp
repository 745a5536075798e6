// The trainer's lease in the local quota mode: the client config comes from quota::client_config_from_setting,
// with quota_db, user and quota_token on top of it.
#include "trainer/app/lease.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>

namespace yolo8 {
namespace {
namespace fs = std::filesystem;

Settings local_settings(const fs::path& db) {
  Settings settings;
  settings.lease.quota = "local";
  settings.lease.quota_db = db.string();
  settings.lease.user = "alice";
  settings.model = "yolov8n.yaml";
  return settings;
}

TEST(TrainingLease, LocalModeUsesTheQuotaDbAndUser) {
  const fs::path root = fs::path(::testing::TempDir()) / ("yolo8_lease_" + std::to_string(getpid()));
  fs::remove_all(root);
  const fs::path db = root / "nested" / "quota.db";
  {
    TrainingLease lease(local_settings(db), "job", /*uses_gpu=*/true, 1);
    EXPECT_TRUE(lease.active());
    EXPECT_GT(lease.id(), 0);
    lease.release(quota::Outcome::kCompleted);
  }
  EXPECT_TRUE(fs::exists(db)) << "the lease lives in quota_db";
  // The local policy names `user` as its only user: a second lease as alice is granted from the same file.
  TrainingLease again(local_settings(db), "job2", true, 1);
  EXPECT_GT(again.id(), 0);
  again.release(quota::Outcome::kCompleted);
  fs::remove_all(root);
}

TEST(TrainingLease, OffAndCpuLocalRunsHoldNoLease) {
  Settings off;
  off.lease.quota = "off";
  EXPECT_FALSE(TrainingLease(off, "job", true, 1).active());
  Settings cpu = local_settings(fs::path(::testing::TempDir()) / "unused.db");
  EXPECT_FALSE(TrainingLease(cpu, "job", /*uses_gpu=*/false, 1).active());
}

// The trainer uses exactly the leased GPUs: device= that says otherwise is refused (exit 2) with what to use.
TEST(TrainingLease, DeviceThatContradictsTheLeaseIsNamed) {
  const std::vector<std::string> lease{"node-a:2", "node-a:3"};
  EXPECT_EQ(device_conflict(lease, {}, "node-a", false), "");  // device= empty: the leased GPUs
  EXPECT_EQ(device_conflict(lease, {3, 2}, "node-a", false), "");
  EXPECT_EQ(device_conflict(lease, {2, 3}, "", false), "");  // node unknown: the indices still count
  const std::string wrong = device_conflict(lease, {0, 1}, "node-a", false);
  EXPECT_NE(wrong.find("setting 'device' (0,1) contradicts the lease, which holds node-a:2, node-a:3: use "
                       "device=2,3"),
            std::string::npos)
      << wrong;
  EXPECT_NE(device_conflict(lease, {2}, "node-a", false), "");  // fewer GPUs than leased
  const std::string elsewhere = device_conflict(lease, {2, 3}, "node-b", false);
  EXPECT_NE(elsewhere.find("runs on node-b"), std::string::npos) << elsewhere;
  // a device plugin numbered the two leased GPUs 0 and 1 inside the container
  EXPECT_EQ(device_conflict(lease, {0, 1}, "node-a", true), "");
  EXPECT_NE(device_conflict(lease, {2}, "node-a", true).find("outside the 2 GPU(s) made visible"), std::string::npos);
}

TEST(TrainingLease, VisibleGpuUuidsComeFromTheDevicePlugin) {
  setenv("NVIDIA_VISIBLE_DEVICES", "GPU-1111,GPU-2222", 1);
  setenv("CUDA_VISIBLE_DEVICES", "0", 1);
  EXPECT_EQ(visible_gpu_uuids(), (std::vector<std::string>{"GPU-1111", "GPU-2222"}));
  setenv("NVIDIA_VISIBLE_DEVICES", "all", 1);  // the runtime's default: no choice was made for us
  EXPECT_TRUE(visible_gpu_uuids().empty());
  setenv("CUDA_VISIBLE_DEVICES", "MIG-abcd", 1);
  EXPECT_EQ(visible_gpu_uuids(), (std::vector<std::string>{"MIG-abcd"}));
  unsetenv("NVIDIA_VISIBLE_DEVICES");
  unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_TRUE(visible_gpu_uuids().empty());
}

TEST(TrainingLease, UnknownModeIsRefusedNamingTheSetting) {
  Settings bad;
  bad.lease.quota = "ftp://somewhere";
  try {
    TrainingLease lease(bad, "job", true, 1);
    FAIL() << "accepted quota=" << bad.lease.quota;
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("quota"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace yolo8
