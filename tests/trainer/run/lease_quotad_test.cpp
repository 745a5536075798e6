// The trainer's lease against the real services, on CPU where the counting allocator enforces the
// budget: batch=-1 sized to the memory of the leased GPU through a quotad process, and two trainers sharing one
// GPU of the local quota, each capped to its share.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <torch/version.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "common/exit_codes.h"
#include "data/synth.h"
#include "tests/quota/quotad_process.h"
#include "tests/trainer/process_util.h"
#include "trainer/run/lease.h"

namespace yolo8 {
namespace {
namespace fs = std::filesystem;

using test::read_text;

void write_text(const fs::path& path, const std::string& text) { std::ofstream(path) << text; }

// One node of `gpus` GPUs of `memory_gib` each; alice (token "alice-token") of team-cv; the memory table's estimate for
// one yolov8n image is far below the GPU, so the lease's memory shows which of the two it carries.
std::string one_node_policy(int memory_gib, int gpus = 1) {
  return "inventory:\n  nodes:\n    - {name: gpu-node, gpus: " + std::to_string(gpus) +
         ", memory_gib: " + std::to_string(memory_gib) +
         "}\n"
         "emergency_pool: 0\n"
         "users:\n  alice: {token_sha256: 9c220f200955d76c0a38d308225e0ef10c5f971acaf2f8d1d8f732affa5bd1dc}\n"
         "  admin: {role: admin, token_sha256: 10a4c7c9fc5206d6f36dc6944a81bb6f4a3cb0e25014ae3b12e6c3e52712292a}\n"
         "teams:\n  team-cv: {base: " +
         std::to_string(gpus) + ", burst: " + std::to_string(gpus) +
         ", members: [alice]}\n"
         "tiers: {self_service: [yolov8n]}\n"
         "credits: {monthly_gpu_hours: 0}\n"
         "leases: {ttl_s: 30, heartbeat_interval_s: 1}\n"
         "memory_table: memory-table.yaml\n";
}

struct Finished {
  int exit_code = -1;
  std::string output;
};

Finished wait_for(pid_t child, const fs::path& log) {
  int status = 0;
  waitpid(child, &status, 0);
  return Finished{test::exit_code_of(status), read_text(log)};
}

std::vector<std::string> train_args(const fs::path& root, const std::string& name) {
  return {"train",
          "data=" + (root / "ds" / "data.yaml").string(),
          "model=yolov8n.yaml",
          "imgsz=64",
          "batch=-1",
          "epochs=1",
          "workers=1",
          "threads=1",
          "device=cpu",
          "val=false",
          "plots=false",
          "project=" + (root / "runs").string(),
          "name=" + name,
          "exist_ok=true"};
}

TEST(LeaseQuotad, AutoBatchIsSizedToTheLeasedGpusMemory) {
  const fs::path root = fs::path(::testing::TempDir()) / ("yolo8_lease_quotad_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  data::synthesize_dataset((root / "ds").string(), 16, 4, 64, 5);
  write_text(root / "memory-table.yaml", "models:\n  yolov8n: {fixed_gib: 1.0, per_image_gib: 0.08}\n");
  for (const int gib : {24, 80}) {
    SCOPED_TRACE(std::to_string(gib) + " GiB inventory");
    const fs::path policy = root / ("policy-" + std::to_string(gib) + ".yaml");
    write_text(policy, one_node_policy(gib));
    test::QuotadProcess quotad;
    ASSERT_TRUE(quotad.start(policy.string(), (root / ("q" + std::to_string(gib) + ".db")).string(),
                             (root / ("quotad-" + std::to_string(gib) + ".log")).string()));
    std::vector<std::string> args = train_args(root, "gpu" + std::to_string(gib));
    for (const char* setting : {"team=team-cv", "user=alice"}) args.emplace_back(setting);
    args.push_back("quota=" + quotad.url());
    const fs::path log = root / ("train-" + std::to_string(gib) + ".log");
    // as in a pod whose GPU the device plugin chose: quotad records the node and the UUID the trainer sees
    const std::map<std::string, std::string> env{
        {"YOLO8_QUOTA_TOKEN", "alice-token"}, {"NVIDIA_VISIBLE_DEVICES", "GPU-0f0e-test"}, {"NODE_NAME", "gpu-node"}};
    const Finished run = wait_for(test::spawn_yolo8(args, env, log.string()), log);
    ASSERT_EQ(run.exit_code, kExitCompleted) << run.output;
    const std::string gib_text = std::to_string(gib);
    EXPECT_NE(run.output.find("granted: 1 GPU (gpu-node:0), " + gib_text + " GiB each"), std::string::npos)
        << run.output;
    EXPECT_NE(run.output.find("sizing the batch to a budget of " + gib_text + ".00 GiB"), std::string::npos)
        << run.output;
    const auto cost = nlohmann::json::parse(read_text(root / "runs" / ("gpu" + gib_text) / "cost.json"));
    EXPECT_DOUBLE_EQ(cost["lease_memory_gib"].get<double>(), gib);
    const fs::path audit = root / "audit.log";
    ASSERT_EQ(std::system((std::string(test::kBinaryDir) + "/quota/quotad audit --server " + quotad.url() +
                           " --token admin-token > " + audit.string() + " 2>&1")
                              .c_str()),
              0);
    EXPECT_NE(read_text(audit).find("gpu-node:0 (trainer on gpu-node sees GPU-0f0e-test)"), std::string::npos)
        << read_text(audit);
    EXPECT_TRUE(quotad.stop());
    // the run's heartbeats carried its peak with model, imgsz, batch, AMP and device: quotad learns from it
    const fs::path learned = root / ("learned-" + gib_text + ".yaml");
    const std::string command = std::string(test::kBinaryDir) + "/quota/quotad memory-table --observed --db " +
                                (root / ("q" + gib_text + ".db")).string() + " --out " + learned.string() + " 2>" +
                                (root / "learn.log").string();
    ASSERT_EQ(std::system(command.c_str()), 0) << read_text(root / "learn.log");
    const std::string table = read_text(learned);
    EXPECT_NE(table.find("device: \"cpu\""), std::string::npos) << table;
    EXPECT_NE(table.find("precision: float32"), std::string::npos) << table;
    EXPECT_NE(table.find(std::string("libtorch: \"") + TORCH_VERSION + "\""), std::string::npos) << table;
    EXPECT_NE(table.find("yolov8n: {fixed_gib: "), std::string::npos) << table;
  }
  fs::remove_all(root);
}

// One schema: the table `yolo8 profile` writes is the table quotad reads (it used to write variants:, which
// quotad refused as an unknown key), with its provenance.
TEST(LeaseQuotad, ProfileTableIsAcceptedByQuotadCheckPolicy) {
  const fs::path root = fs::path(::testing::TempDir()) / ("yolo8_profile_table_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  const fs::path table = root / "memory-table.yaml";
  const fs::path log = root / "profile.log";
  const Finished profile =
      wait_for(test::spawn_yolo8({"profile", "variants=n", "imgsz=64", "batch=1,2", "threads=1", "device=cpu",
                                  "project=" + (root / "runs").string(), "out=" + table.string()},
                                 {}, log.string()),
               log);
  ASSERT_EQ(profile.exit_code, kExitCompleted) << profile.output;
  const std::string text = read_text(table);
  EXPECT_NE(text.find("provenance:"), std::string::npos) << text;
  write_text(root / "policy.yaml", one_node_policy(24));
  const std::string quotad = std::string(test::kBinaryDir) + "/quota/quotad";
  const fs::path check_log = root / "check.log";
  const int status = std::system((quotad + " check-policy " + (root / "policy.yaml").string() + " --memory-table " +
                                  table.string() + " > " + check_log.string() + " 2>&1")
                                     .c_str());
  const std::string check = read_text(check_log);
  ASSERT_EQ(status, 0) << check << "\n" << text;
  EXPECT_NE(check.find("memory table " + table.string() + ": ok: 1 models (yolov8n); source yolo8 profile at imgsz 64"),
            std::string::npos)
      << check;
  EXPECT_NE(check.find("measured on cpu, float32, LibTorch "), std::string::npos) << check;
  // the policy's own table (memory_table: memory-table.yaml next to it) is the profiler's file too
  EXPECT_NE(check.find("policy.yaml: ok: 1 GPUs"), std::string::npos) << check;
  fs::remove_all(root);
}

// Through quotad the trainer uses the GPU it was leased on its node, numbered as CUDA_VISIBLE_DEVICES numbers
// it; a leased GPU the list hides is refused naming `device`, and the lease is given back.
TEST(LeaseQuotad, TheTrainerUsesTheLeasedGpuAsCudaNumbersIt) {
  const fs::path root = fs::path(::testing::TempDir()) / ("yolo8_lease_bind_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  write_text(root / "memory-table.yaml", "models:\n  yolov8n: {fixed_gib: 1.0, per_image_gib: 0.08}\n");
  write_text(root / "policy.yaml", one_node_policy(24, 4));
  test::QuotadProcess quotad;
  ASSERT_TRUE(quotad.start((root / "policy.yaml").string(), (root / "q.db").string(), (root / "quotad.log").string()));
  Settings settings;
  settings.model = "yolov8n.yaml";
  settings.lease.quota = quotad.url();
  settings.lease.team = "team-cv";
  settings.lease.user = "alice";
  settings.lease.quota_token = "alice-token";
  setenv("NODE_NAME", "gpu-node", 1);
  setenv("CUDA_VISIBLE_DEVICES", "1,0", 1);
  {
    TrainingLease first(settings, "first", /*uses_gpu=*/true, 1);
    TrainingLease second(settings, "second", true, 1);
    EXPECT_EQ(first.devices().summary, "Using GPU 1 (leased gpu-node:0)");
    EXPECT_EQ(second.devices().summary, "Using GPU 0 (leased gpu-node:1)");
    try {
      TrainingLease hidden(settings, "hidden", true, 1);  // gpu-node:2, which CUDA_VISIBLE_DEVICES=1,0 hides
      FAIL() << "a lease on a hidden GPU was used: " << hidden.devices().summary;
    } catch (const SettingsError& error) {
      EXPECT_NE(std::string(error.what()).find("GPU gpu-node:2 is not visible to this process"), std::string::npos)
          << error.what();
    }
    unsetenv("CUDA_VISIBLE_DEVICES");
    TrainingLease third(settings, "third", true, 1);  // the refused one gave gpu-node:2 back
    EXPECT_EQ(third.devices().summary, "Using GPU 2 (leased gpu-node:2)");
    for (TrainingLease* lease : {&first, &second, &third}) lease->release(quota::Outcome::kCompleted);
  }
  unsetenv("NODE_NAME");
  EXPECT_TRUE(quotad.stop());
  fs::remove_all(root);
}

TEST(LeaseQuotad, TwoSharedLeasesOnOneLocalGpuStayUnderTheirShares) {
  const fs::path root = fs::path(::testing::TempDir()) / ("yolo8_lease_shared_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  data::synthesize_dataset((root / "ds").string(), 16, 4, 64, 5);
  const std::string db = (root / "quota.db").string();
  pid_t children[2];
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> args = train_args(root, "share" + std::to_string(i));
    args.insert(args.end(), {"quota=local", "quota_db=" + db, "user=alice", "shared=true", "memory_gib=0.5"});
    children[i] = test::spawn_yolo8(args, {}, (root / ("share" + std::to_string(i) + ".log")).string());
  }
  for (int i = 0; i < 2; ++i) {
    const std::string name = "share" + std::to_string(i);
    const Finished run = wait_for(children[i], root / (name + ".log"));
    ASSERT_EQ(run.exit_code, kExitCompleted) << run.output;
    // both hold a share of the same GPU at once: neither waited for the other
    EXPECT_NE(run.output.find("granted: a share of 1 GPU (local:0), 0.5 GiB each"), std::string::npos) << run.output;
    EXPECT_EQ(run.output.find("waiting ("), std::string::npos) << run.output;
    const auto cost = nlohmann::json::parse(read_text(root / "runs" / name / "cost.json"));
    EXPECT_DOUBLE_EQ(cost["lease_memory_gib"].get<double>(), 0.5);
    EXPECT_GT(cost["peak_memory_gib"].get<double>(), 0.0);
    EXPECT_LE(cost["peak_memory_gib"].get<double>(), 0.5) << name;
  }
  fs::remove_all(root);
}

}  // namespace
}  // namespace yolo8
