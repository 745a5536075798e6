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
