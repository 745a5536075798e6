// Utilisation from NVML through a fake libnvidia-ml (loaded by path, as the real one is by name), and the busy
// share that replaces it without a GPU: a stalled job reports 0 after one interval.
#include "trainer/runtime/utilisation.h"

#include <unistd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace yolo8 {
namespace {

class FakeNvml : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("FAKE_NVML_DEVICES", "2", 1);
    setenv("FAKE_NVML_UTIL_0", "80", 1);
    setenv("FAKE_NVML_UTIL_1", "40", 1);
    setenv("FAKE_NVML_USED_MIB_0", "1024", 1);
    setenv("FAKE_NVML_USED_MIB_1", "3072", 1);
    unsetenv("FAKE_NVML_INIT");
    for (const char* name : {"FAKE_NVML_RESERVED_MIB_0", "FAKE_NVML_RESERVED_MIB_1", "FAKE_NVML_PROCESSES_0",
                             "FAKE_NVML_PROCESSES_1", "FAKE_NVML_SAMPLES_0", "FAKE_NVML_SAMPLES_1"}) {
      unsetenv(name);
    }
  }
};

unsigned long long now_us() {
  return static_cast<unsigned long long>(
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
}

TEST_F(FakeNvml, ReadsEachDeviceByIndexAndUuid) {
  std::string why;
  const std::unique_ptr<Nvml> nvml = Nvml::load(YOLO8_FAKE_NVML_PATH, &why);
  ASSERT_NE(nvml, nullptr) << why;
  const auto first = nvml->sample("0");
  ASSERT_TRUE(first.has_value());
  EXPECT_DOUBLE_EQ(first->util, 0.80);
  EXPECT_DOUBLE_EQ(first->memory_used_gib, 1.0);
  EXPECT_DOUBLE_EQ(first->memory_total_gib, 24.0);
  const auto second = nvml->sample("GPU-fake-1");
  ASSERT_TRUE(second.has_value());
  EXPECT_DOUBLE_EQ(second->util, 0.40);
  EXPECT_FALSE(nvml->sample("7").has_value());
  EXPECT_FALSE(nvml->sample("GPU-other").has_value());
}

TEST_F(FakeNvml, SamplerReportsTheMeanOfTheLeasedDevicesAsNvml) {
  UtilisationSampler sampler(Nvml::load(YOLO8_FAKE_NVML_PATH), {"0", "1"}, 0.0);
  const UtilisationSampler::Reading reading = sampler.sample(/*busy_seconds=*/0.0, /*now_s=*/10.0);
  EXPECT_EQ(reading.source, "nvml");
  EXPECT_DOUBLE_EQ(reading.util, 0.60);
  EXPECT_DOUBLE_EQ(reading.device_memory_used_gib, 3.0);  // the busiest device
  // The devices go idle: the next heartbeat says so.
  setenv("FAKE_NVML_UTIL_0", "0", 1);
  setenv("FAKE_NVML_UTIL_1", "0", 1);
  EXPECT_DOUBLE_EQ(sampler.sample(0.0, 20.0).util, 0.0);
}

// nvidia-smi's "used" leaves the driver's reserved memory out (NVML's v2 query); the v1 query counts it in, and a
// heartbeat compared with nvidia-smi would differ by the reserve.
TEST_F(FakeNvml, UsedMemoryIsNvidiaSmisLeavingTheDriversReserveOut) {
  setenv("FAKE_NVML_RESERVED_MIB_0", "512", 1);
  const std::unique_ptr<Nvml> nvml = Nvml::load(YOLO8_FAKE_NVML_PATH);
  const auto sample = nvml->sample("0");
  ASSERT_TRUE(sample.has_value());
  EXPECT_DOUBLE_EQ(sample->memory_used_gib, 1.0);  // not 1.5
  EXPECT_EQ(sample->memory_basis, "v2");
}

// Two shared leases on one GPU each report their own process's memory, not the device's sum.
TEST_F(FakeNvml, EachProcessReportsItsOwnMemoryBesideTheDevices) {
  const unsigned int me = static_cast<unsigned int>(getpid());
  setenv("FAKE_NVML_PROCESSES_0", (std::to_string(me + 1) + ":2048," + std::to_string(me) + ":768").c_str(), 1);
  const std::unique_ptr<Nvml> nvml = Nvml::load(YOLO8_FAKE_NVML_PATH);
  EXPECT_DOUBLE_EQ(nvml->process_memory_gib("0", me).value_or(-1), 0.75);
  EXPECT_DOUBLE_EQ(nvml->process_memory_gib("0", me + 1).value_or(-1), 2.0);
  EXPECT_FALSE(nvml->process_memory_gib("0", me + 2).has_value());  // a PID NVML does not list: unknown
  EXPECT_FALSE(nvml->process_memory_gib("1", me).has_value());
  UtilisationSampler sampler(Nvml::load(YOLO8_FAKE_NVML_PATH), {"0"}, 0.0);
  const UtilisationSampler::Reading reading = sampler.sample(0.0, 10.0);
  EXPECT_DOUBLE_EQ(reading.process_memory_used_gib, 0.75);
  EXPECT_DOUBLE_EQ(reading.device_memory_used_gib, 1.0);
}

// Where the driver keeps utilisation samples, a heartbeat reports their mean since the last one: a single reading of
// the driver's last period, taken in phase with the epochs' idle moments, read 0 % for heartbeat after heartbeat of
// a GPU that nvidia-smi showed 60-80 % busy (the first H200 check).
TEST_F(FakeNvml, UtilisationIsTheMeanOfTheDriversSamplesSinceTheLastHeartbeat) {
  setenv("FAKE_NVML_UTIL_0", "0", 1);               // the last period: idle
  const unsigned long long t = now_us() + 1000000;  // samples taken after the sampler started
  const std::string samples = std::to_string(t) + ":80," + std::to_string(t + 1) + ":60," + std::to_string(t + 2) +
                              ":70," + std::to_string(t + 3) + ":0";
  setenv("FAKE_NVML_SAMPLES_0", samples.c_str(), 1);
  UtilisationSampler sampler(Nvml::load(YOLO8_FAKE_NVML_PATH), {"0"}, 0.0);
  EXPECT_DOUBLE_EQ(sampler.sample(0.0, 2.0).util, 0.525);
  // The next heartbeat averages only what came after: here one more sample.
  setenv("FAKE_NVML_SAMPLES_0", (samples + "," + std::to_string(t + 4) + ":90").c_str(), 1);
  EXPECT_DOUBLE_EQ(sampler.sample(0.0, 4.0).util, 0.90);
  // None since: the driver's last period, as without samples.
  EXPECT_DOUBLE_EQ(sampler.sample(0.0, 6.0).util, 0.0);
  EXPECT_EQ(sampler.sample(0.0, 8.0).source, "nvml");
}

TEST_F(FakeNvml, ADeviceNvmlCannotReadFallsBackToBusyTime) {
  UtilisationSampler sampler(Nvml::load(YOLO8_FAKE_NVML_PATH), {"0", "GPU-missing"}, 0.0);
  const UtilisationSampler::Reading reading = sampler.sample(5.0, 10.0);
  EXPECT_EQ(reading.source, "busy_time");
  EXPECT_DOUBLE_EQ(reading.util, 0.5);
  EXPECT_LT(reading.device_memory_used_gib, 0);
}

TEST_F(FakeNvml, LoadFailuresSayWhy) {
  std::string why;
  EXPECT_EQ(Nvml::load("/nonexistent/libnvidia-ml.so.1", &why), nullptr);
  EXPECT_NE(why.find("libnvidia-ml.so.1"), std::string::npos) << why;
  setenv("FAKE_NVML_INIT", "3", 1);
  EXPECT_EQ(Nvml::load(YOLO8_FAKE_NVML_PATH, &why), nullptr);
  EXPECT_NE(why.find("nvmlInit_v2 failed with code 3"), std::string::npos) << why;
  // A library without the NVML symbols (the C library) is refused by name.
  EXPECT_EQ(Nvml::load("libc.so.6", &why), nullptr);
  EXPECT_NE(why.find("has no nvmlInit_v2"), std::string::npos) << why;
}

// No GPU: the share of each heartbeat interval spent in steps, not since the start of the run.
TEST(BusyTimeUtilisation, AStalledJobReportsZeroAfterOneInterval) {
  UtilisationSampler sampler(nullptr, {}, 100.0);
  EXPECT_EQ(sampler.sample(9.0, 110.0).source, "busy_time");
  EXPECT_DOUBLE_EQ(sampler.sample(18.0, 120.0).util, 0.9);
  // Steps stop finishing: the busy total stays at 18 s.
  EXPECT_DOUBLE_EQ(sampler.sample(18.0, 130.0).util, 0.0);
  EXPECT_DOUBLE_EQ(sampler.sample(23.0, 140.0).util, 0.5);
}

// Two ranks, each reading its own device through NVML (rank 0: device 0 at 80 %, rank 1: device 1 at 40 %), combined
// every few steps; rank 0's heartbeat reports the ranks' mean while combinations keep coming, and when they stop
// (the job stalls) rank 0's device alone, read now, after one interval: the other rank's last 40 % no longer
// holds the figure up.
TEST_F(FakeNvml, RanksCombineTheirOwnDevicesAndAStallDropsTheirStaleFigures) {
  const std::unique_ptr<Nvml> rank0 = Nvml::load(YOLO8_FAKE_NVML_PATH);
  const std::unique_ptr<Nvml> rank1 = Nvml::load(YOLO8_FAKE_NVML_PATH);
  ASSERT_NE(rank0, nullptr);
  ASSERT_NE(rank1, nullptr);
  constexpr double kInterval = 10.0;
  UtilisationSampler heartbeat(Nvml::load(YOLO8_FAKE_NVML_PATH), {"0"}, 0.0);  // rank 0's own device
  const auto combine = [&](double now_s) {
    const auto a = rank0->sample("0");
    const auto b = rank1->sample("GPU-fake-1");
    return RanksUtilisation::from_sums(2, (a ? a->util : 0) + (b ? b->util : 0), (a ? 0 : 1) + (b ? 0 : 1),
                                       std::max(a ? a->memory_used_gib : 0, b ? b->memory_used_gib : 0), now_s);
  };
  const RanksUtilisation ranks = combine(8.0);
  EXPECT_TRUE(ranks.all_nvml);
  const UtilisationSampler::Reading live = with_other_ranks(heartbeat.sample(9.0, 10.0), ranks, 10.0, kInterval);
  EXPECT_EQ(live.source, "nvml");
  EXPECT_DOUBLE_EQ(live.util, 0.60);
  EXPECT_DOUBLE_EQ(live.device_memory_used_gib, 3.0);  // rank 1's device is the busiest
  // The job stalls: no step, no combination; both GPUs go idle. One interval later only rank 0's device counts.
  setenv("FAKE_NVML_UTIL_0", "0", 1);
  setenv("FAKE_NVML_UTIL_1", "0", 1);
  const UtilisationSampler::Reading stalled = with_other_ranks(heartbeat.sample(9.0, 20.0), ranks, 20.0, kInterval);
  EXPECT_EQ(stalled.source, "nvml");
  EXPECT_DOUBLE_EQ(stalled.util, 0.0);
  EXPECT_DOUBLE_EQ(with_other_ranks(heartbeat.sample(9.0, 30.0), ranks, 30.0, kInterval).util, 0.0);
  // Steps resume: the next combination counts again.
  setenv("FAKE_NVML_UTIL_0", "90", 1);
  setenv("FAKE_NVML_UTIL_1", "70", 1);
  EXPECT_DOUBLE_EQ(with_other_ranks(heartbeat.sample(12.0, 40.0), combine(39.0), 40.0, kInterval).util, 0.80);
}

// A rank without NVML (no driver library in its pod): the job reports the busy share, the ranks' mean already,
// never a mix of sources; one process, or no combination yet, is the sampler's own reading.
TEST(RanksUtilisation, ARankWithoutNvmlMeansBusyTimeForTheJob) {
  UtilisationSampler::Reading own;
  own.util = 0.9;
  own.source = "nvml";
  own.device_memory_used_gib = 5;
  own.busy_share = 0.7;
  const RanksUtilisation partial = RanksUtilisation::from_sums(4, 2.4, 1, 6.0, 100.0);
  EXPECT_FALSE(partial.all_nvml);
  for (const double now : {101.0, 500.0}) {  // fresh or stale: a rank will not gain NVML
    const UtilisationSampler::Reading reading = with_other_ranks(own, partial, now, 10.0);
    EXPECT_EQ(reading.source, "busy_time");
    EXPECT_DOUBLE_EQ(reading.util, 0.7);
    EXPECT_LT(reading.device_memory_used_gib, 0);
  }
  EXPECT_DOUBLE_EQ(with_other_ranks(own, RanksUtilisation{}, 100.0, 10.0).util, 0.9);  // none yet
  EXPECT_DOUBLE_EQ(with_other_ranks(own, RanksUtilisation::from_sums(1, 0.1, 0, 1, 100.0), 100.0, 10.0).util, 0.9);
  EXPECT_DOUBLE_EQ(RanksUtilisation::from_sums(4, 2.4, 0, 6.0, 100.0).util, 0.6);
}

// Without CUDA's word (a CPU-only build): the visible list's entries, else the numbers.
TEST(NvmlDeviceNames, FollowCudaVisibleDevicesWhereCudaNamesNoUuid) {
  const CudaUuidLookup none = [](int) { return std::nullopt; };
  EXPECT_EQ(nvml_device_names({0, 1}, "", none), (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(nvml_device_names({0, 1}, "3,5", none), (std::vector<std::string>{"3", "5"}));
  EXPECT_EQ(nvml_device_names({1}, "GPU-aa,GPU-bb", none), (std::vector<std::string>{"GPU-bb"}));
  EXPECT_TRUE(nvml_device_names({2}, "3", none).empty());  // not visible: nothing to read
}

// CUDA's default order is fastest first, NVML's the PCI bus: on a node whose second card is the faster one, CUDA 0 is
// NVML 1. The UUID CUDA reports names the device, whatever the numbering.
TEST(NvmlDeviceNames, TheUuidCudaReportsWinsOverTheNumbers) {
  const CudaUuidLookup fastest_first = [](int id) -> std::optional<std::string> {
    return id == 0 ? "GPU-bbbb" : id == 1 ? "GPU-aaaa" : std::optional<std::string>();
  };
  EXPECT_EQ(nvml_device_names({0, 1}, "", fastest_first), (std::vector<std::string>{"GPU-bbbb", "GPU-aaaa"}));
  EXPECT_EQ(nvml_device_names({0}, "0,1", fastest_first), (std::vector<std::string>{"GPU-bbbb"}));
}

TEST(NvmlDeviceNames, CudaDevicesHaveUuidsInNvmlsForm) {
  EXPECT_EQ(cuda_device_uuid(-1), std::nullopt);
  if (!torch::cuda::is_available()) {
    EXPECT_EQ(cuda_device_uuid(0), std::nullopt);
    GTEST_SKIP() << "no CUDA device: the GPU's UUID is checked on a GPU machine";
  }
  const std::optional<std::string> uuid = cuda_device_uuid(0);
  ASSERT_TRUE(uuid.has_value());
  EXPECT_EQ(uuid->rfind("GPU-", 0), 0u) << *uuid;
  EXPECT_EQ(uuid->size(), 40u) << *uuid;  // GPU- and 8-4-4-4-12 hex digits
}

}  // namespace
}  // namespace yolo8
