// Utilisation from NVML through a fake libnvidia-ml (loaded by path, as the real one is by name), and the busy
// share that replaces it without a GPU: a stalled job reports 0 after one interval.
#include "trainer/app/utilisation.h"

#include <gtest/gtest.h>

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
  }
};

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

TEST(NvmlDeviceNames, FollowCudaVisibleDevices) {
  EXPECT_EQ(nvml_device_names({0, 1}, ""), (std::vector<std::string>{"0", "1"}));
  EXPECT_EQ(nvml_device_names({0, 1}, "3,5"), (std::vector<std::string>{"3", "5"}));
  EXPECT_EQ(nvml_device_names({1}, "GPU-aa,GPU-bb"), (std::vector<std::string>{"GPU-bb"}));
  EXPECT_TRUE(nvml_device_names({2}, "3").empty());  // not visible: nothing to read
}

}  // namespace
}  // namespace yolo8
