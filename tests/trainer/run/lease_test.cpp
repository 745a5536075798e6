// The trainer's lease in the local quota mode: the client config comes from quota::client_config_from_setting,
// with quota_db, user and quota_token on top of it; against a fake quotad, the record of an unacknowledged release.
#include "trainer/run/lease.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "tests/quota/client/fake_quotad.h"
#include "trainer/core/stop_signal.h"

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

// quotad answers nothing usable as the run ends (a follower's 503 naming a leader the setting does not list): the
// release is not acknowledged, so "released" is not printed and the lease is recorded in the run folder; the
// next run there releases it (its outcome again) before asking for its own, and removes the record.
TEST(TrainingLease, AnUnacknowledgedReleaseIsRecordedAndTheNextRunReleasesIt) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("yolo8_lease_record_" + std::to_string(getpid()));
  fs::remove_all(dir);
  const fs::path record = dir / kUnreleasedLeaseFile;
  quota::testing::FakeQuotad quotad({}, 6, 1);
  Settings settings;
  settings.lease.quota = quotad.url();
  settings.model = "yolov8n.yaml";
  {
    TrainingLease lease(settings, "job", /*uses_gpu=*/false, 1, {}, "cpu", record);
    ASSERT_EQ(lease.id(), 7);
    quotad.follow("http://127.0.0.1:1");
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // a heartbeat meets it
    ::testing::internal::CaptureStdout();
    lease.release(quota::Outcome::kPreempted);
    const std::string output = ::testing::internal::GetCapturedStdout();
    EXPECT_EQ(output.find("Lease 7 released"), std::string::npos) << output;
    EXPECT_NE(output.find("Lease 7 release not acknowledged"), std::string::npos) << output;
    EXPECT_NE(output.find("the next run here releases it (" + record.string() + ")"), std::string::npos) << output;
  }
  ASSERT_TRUE(fs::exists(record));
  EXPECT_FALSE(fs::exists(record.string() + ".part"));
  EXPECT_EQ(quotad.releases(), 0);

  quotad.lead();
  ::testing::internal::CaptureStdout();
  TrainingLease next(settings, "job", false, 1, {}, "cpu", record);
  const std::string output = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(output.find("Lease 7 of an earlier run here (its release was not acknowledged): released now (preempted)"),
            std::string::npos)
      << output;
  EXPECT_LT(output.find("of an earlier run here"), output.find("Asking ")) << "released before the new request";
  EXPECT_EQ(quotad.releases(), 1);
  EXPECT_FALSE(fs::exists(record));
  next.release(quota::Outcome::kCompleted);
  EXPECT_EQ(quotad.releases(), 2);
  fs::remove_all(dir);
}

// A record of a lease asked of another quota service is not sent here: the lease expires there.
TEST(TrainingLease, ARecordOfAnotherQuotaIsLeftToExpireThere) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("yolo8_lease_other_" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path record = dir / kUnreleasedLeaseFile;
  std::ofstream(record) << R"({"lease_id": 7, "quota": "http://quotad-old:8470", "outcome": "completed"})";
  quota::testing::FakeQuotad quotad({});
  Settings settings;
  settings.lease.quota = quotad.url();
  settings.model = "yolov8n.yaml";
  ::testing::internal::CaptureStdout();
  TrainingLease lease(settings, "job", false, 1, {}, "cpu", record);
  const std::string output = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(output.find("Lease 7 of an earlier run here (its release was not acknowledged): asked of "
                        "http://quotad-old:8470, not of quota=" +
                        quotad.url() + "; left to expire there"),
            std::string::npos)
      << output;
  EXPECT_EQ(quotad.releases(), 0);
  EXPECT_FALSE(fs::exists(record));
  lease.release(quota::Outcome::kCompleted);
  fs::remove_all(dir);
}

TEST(TrainingLease, OffAndCpuLocalRunsHoldNoLease) {
  Settings off;
  off.lease.quota = "off";
  EXPECT_FALSE(TrainingLease(off, "job", true, 1).active());
  Settings cpu = local_settings(fs::path(::testing::TempDir()) / "unused.db");
  EXPECT_FALSE(TrainingLease(cpu, "job", /*uses_gpu=*/false, 1).active());
}

// bind_leased_devices' refusal text, or "accepted".
std::string refusal(const std::vector<std::string>& lease, const std::string& node, const std::vector<int>& device,
                    const std::string& visible = "", bool remapped = false) {
  try {
    bind_leased_devices(lease, node, device, visible, remapped);
  } catch (const SettingsError& error) {
    return error.what();
  }
  return "accepted";
}

std::vector<int> ordinals(const std::vector<std::string>& lease, const std::string& node,
                          const std::vector<int>& device, const std::string& visible = "", bool remapped = false) {
  return bind_leased_devices(lease, node, device, visible, remapped).ordinals;
}

// The trainer uses exactly the leased GPUs: device= empty goes to them, device= that says otherwise is refused
// (exit 2) with what to use.
TEST(TrainingLease, DeviceEmptyUsesTheLeasedGpu) {
  const DeviceBinding binding = bind_leased_devices({"node-a:2"}, "node-a", {}, "", false);
  EXPECT_EQ(binding.ordinals, std::vector<int>{2});
  EXPECT_EQ(binding.summary, "Using GPU 2 (leased node-a:2)");
  EXPECT_EQ(ordinals({"node-a:2"}, "", {}), std::vector<int>{2});  // node unknown: the lease's GPU still
  EXPECT_TRUE(ordinals({}, "node-a", {0}).empty());                // no lease, nothing to bind
}

TEST(TrainingLease, DeviceThatContradictsTheLeaseIsNamed) {
  const std::vector<std::string> lease{"node-a:2", "node-a:3"};
  EXPECT_EQ(ordinals(lease, "node-a", {3, 2}), (std::vector<int>{3, 2}));  // as given, when it is the lease's
  EXPECT_EQ(ordinals(lease, "", {2, 3}), (std::vector<int>{2, 3}));        // node unknown: the indices still count
  EXPECT_NE(refusal(lease, "node-a", {0, 1})
                .find("setting 'device' (0,1) contradicts the lease, which holds node-a:2, node-a:3: use "
                      "device=2,3, or leave device= empty"),
            std::string::npos)
      << refusal(lease, "node-a", {0, 1});
  EXPECT_NE(refusal(lease, "node-a", {2}).find("use device=2,3"), std::string::npos);  // fewer GPUs than leased
  EXPECT_NE(refusal(lease, "node-b", {2, 3}).find("runs on node-b"), std::string::npos);
  EXPECT_NE(refusal(lease, "node-b", {}).find("setting 'device' (empty) cannot use the lease"), std::string::npos);
}

// An indexed Job's lease spans nodes: this trainer's GPUs are the ones leased on its node.
TEST(TrainingLease, OnlyTheGpusLeasedOnThisNodeAreThisProcesss) {
  const std::vector<std::string> lease{"node-a:1", "node-b:0"};
  EXPECT_EQ(ordinals(lease, "node-a", {1}), std::vector<int>{1});
  EXPECT_EQ(ordinals(lease, "node-b", {}), std::vector<int>{0});
  EXPECT_NE(refusal(lease, "node-a", {0}).find("use device=1,"), std::string::npos) << refusal(lease, "node-a", {0});
}

// CUDA_VISIBLE_DEVICES=1,2 numbers physical GPU 2 as CUDA device 1.
TEST(TrainingLease, CudaVisibleDevicesRenumbersTheLeasedGpus) {
  const DeviceBinding binding = bind_leased_devices({"node-a:2"}, "node-a", {}, "1,2", false);
  EXPECT_EQ(binding.ordinals, std::vector<int>{1});
  EXPECT_EQ(binding.summary, "Using GPU 1 (leased node-a:2)");
  EXPECT_EQ(ordinals({"node-a:2"}, "node-a", {1}, "1,2"), std::vector<int>{1});
  EXPECT_EQ(ordinals({"node-a:3", "node-a:1"}, "node-a", {}, " 3 , 1"), std::vector<int>{0});
  const std::string wrong = refusal({"node-a:2"}, "node-a", {2}, "1,2");
  EXPECT_NE(wrong.find("use device=1 (as CUDA_VISIBLE_DEVICES=1,2 numbers them)"), std::string::npos) << wrong;
  const std::string hidden = refusal({"node-a:0"}, "node-a", {}, "1,2");
  EXPECT_NE(hidden.find("setting 'device' (empty) cannot use the lease, which holds node-a:0: GPU node-a:0 is not "
                        "visible to this process (CUDA_VISIBLE_DEVICES=1,2); add 0 to CUDA_VISIBLE_DEVICES"),
            std::string::npos)
      << hidden;
  // CUDA ignores the entries from the first one that is no index on
  EXPECT_NE(refusal({"node-a:0"}, "node-a", {}, "2,x,0").find("not visible"), std::string::npos);
  EXPECT_NE(refusal({"node-a:0"}, "node-a", {}, "-1").find("not visible"), std::string::npos);
}

// A device plugin chose the GPUs (UUIDs visible): the container numbers them 0..n-1.
TEST(TrainingLease, DevicePluginGpusAreNumberedFromZero) {
  const std::vector<std::string> lease{"node-a:2", "node-a:3"};
  EXPECT_EQ(ordinals(lease, "node-a", {0, 1}, "", true), (std::vector<int>{0, 1}));
  EXPECT_EQ(ordinals(lease, "node-a", {}, "", true), std::vector<int>{0});
  EXPECT_EQ(ordinals({"node-a:5"}, "", {}, "GPU-1111", false), std::vector<int>{0});  // UUIDs in CUDA_VISIBLE_DEVICES
  EXPECT_NE(refusal(lease, "node-a", {2}, "", true).find("outside the 2 GPU(s) made visible"), std::string::npos);
}

// The local quota's inventory is this machine's GPUs, numbered by CUDA ordinal: two trainers sharing the quota
// db get different GPUs and use them; a device= naming another trainer's GPU is refused, and gives its lease back.
TEST(TrainingLease, LocalTrainersGetDifferentGpusOfTheMachine) {
  const fs::path root = fs::path(::testing::TempDir()) / ("yolo8_lease_bind_" + std::to_string(getpid()));
  fs::remove_all(root);
  const fs::path db = root / "quota.db";
  const LocalGpus machine{4, 24.0};
  TrainingLease first(local_settings(db), "first", /*uses_gpu=*/true, 1, machine);
  TrainingLease second(local_settings(db), "second", true, 1, machine);
  EXPECT_EQ(first.devices().ordinals, std::vector<int>{0});
  EXPECT_EQ(second.devices().ordinals, std::vector<int>{1});
  EXPECT_EQ(second.devices().summary, "Using GPU 1 (leased local:1)");
  EXPECT_DOUBLE_EQ(second.memory_gib(), 24.0);  // a whole GPU of the inventory
  Settings asked = local_settings(db);
  asked.device = "3";  // a GPU named by device= is the one asked for, not the lowest free one
  TrainingLease third(asked, "third", true, 1, machine);
  EXPECT_EQ(third.devices().ordinals, std::vector<int>{3});
  EXPECT_EQ(third.devices().summary, "Using GPU 3 (leased local:3)");
  Settings taken = local_settings(db);
  taken.device = "0";  // held by `first`: this run waits for it (a stop while waiting gives its place up)
  request_stop(StopReason::kSignal);
  EXPECT_THROW(TrainingLease(taken, "waiting", true, 1, machine), StoppedWhileWaiting);
  reset_stop_state();
  Settings free = local_settings(db);
  free.device = "2";  // the run that gave up holds nothing: local:2 is still free
  TrainingLease fourth(free, "fourth", true, 1, machine);
  EXPECT_EQ(fourth.devices().ordinals, std::vector<int>{2});
  for (TrainingLease* lease : {&first, &second, &third, &fourth}) lease->release(quota::Outcome::kCompleted);
  fs::remove_all(root);
}

TEST(TrainingLease, DeviceAsksTheNodesGpusByNumber) {
  EXPECT_EQ(node_gpu_indices({0, 1}, ""), (std::vector<int>{0, 1}));
  EXPECT_EQ(node_gpu_indices({1}, "4,6"), std::vector<int>{6});  // CUDA numbers the visible GPUs 0..n-1
  EXPECT_TRUE(node_gpu_indices({2}, "4,6").empty());             // not visible: bind_leased_devices says so
  EXPECT_TRUE(node_gpu_indices({0}, "GPU-1111").empty());        // a device plugin's choice goes by UUID
  EXPECT_TRUE(node_gpu_indices({}, "4,6").empty());
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
