// The policy in quotad's ConfigMap must be one quotad accepts, with the figures the other manifests assume.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <string>

#include "quota/core/policy.h"
#include "test_paths.h"

namespace yolo8 {
namespace {

TEST(DeployPolicy, ConfigMapPolicyLoadsInQuotad) {
  const std::string file = std::string(test::kSourceDir) + "/deploy/k8s/quotad/configmap-policy.yaml";
  const YAML::Node cm = YAML::LoadFile(file);
  const quota::Policy policy = quota::load_policy_from_string(cm["data"]["quota-policy.yaml"].as<std::string>(), file);
  EXPECT_EQ(policy.total_gpus(), 16);
  EXPECT_EQ(policy.emergency_pool_gpus(), 3);  // the yolo8-emergency ClusterQueue's nominalQuota
  ASSERT_EQ(policy.teams.count("team-cv"), 1u);
  EXPECT_EQ(policy.teams.at("team-cv").base, 8);
  EXPECT_EQ(policy.teams.at("team-cv").burst, 14);
  ASSERT_EQ(policy.teams.count("team-interns"), 1u);
  EXPECT_EQ(policy.teams.at("team-interns").base, 2);
  EXPECT_EQ(policy.teams.at("team-interns").burst, 3);
}

}  // namespace
}  // namespace yolo8
