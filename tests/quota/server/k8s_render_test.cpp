#include "quota/server/k8s_render.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <map>

#include "test_paths.h"

namespace yolo8::quota {
namespace {

const std::string kPolicyPath = std::string(test::kSourceDir) + "/configs/quota-policy.yaml";

std::map<std::string, YAML::Node> by_kind_and_namespace(const std::string& text) {
  std::map<std::string, YAML::Node> objects;
  for (const YAML::Node& doc : YAML::LoadAll(text)) {
    if (!doc.IsMap()) continue;
    const std::string ns = doc["metadata"]["namespace"] ? doc["metadata"]["namespace"].as<std::string>()
                                                        : doc["metadata"]["name"].as<std::string>();
    objects[doc["kind"].as<std::string>() + "/" + ns] = doc;
  }
  return objects;
}

TEST(RenderK8s, OneQuotaPerTeamAtItsBurstLimitAndDeterministic) {
  const Policy policy = load_policy(kPolicyPath);
  const std::string text = render_k8s(policy);
  EXPECT_EQ(text, render_k8s(load_policy(kPolicyPath)));
  const auto objects = by_kind_and_namespace(text);
  for (const auto& [name, team] : policy.teams) {
    ASSERT_TRUE(objects.count("Namespace/" + name)) << name;
    ASSERT_TRUE(objects.count("ResourceQuota/" + name)) << name;
    ASSERT_TRUE(objects.count("LimitRange/" + name)) << name;
    const YAML::Node quota = objects.at("ResourceQuota/" + name);
    EXPECT_EQ(quota["spec"]["hard"]["requests.nvidia.com/gpu"].as<double>(), team.burst) << name;
    const YAML::Node limits = objects.at("LimitRange/" + name)["spec"]["limits"][0];
    EXPECT_EQ(limits["default"]["nvidia.com/gpu"].as<int>(), policy.default_gpus);
  }
}

// The hand-kept manifests in deploy/ must agree with what the policy renders.
TEST(RenderK8s, DeployManifestsAgreeWithThePolicy) {
  const auto rendered = by_kind_and_namespace(render_k8s(load_policy(kPolicyPath)));
  for (const char* team : {"team-cv", "team-interns"}) {
    const std::string path = std::string(test::kSourceDir) + "/deploy/k8s/teams/" + team + ".yaml";
    std::string text;
    for (const YAML::Node& doc : YAML::LoadAllFromFile(path)) text += YAML::Dump(doc) + "\n---\n";
    const auto manifests = by_kind_and_namespace(text);
    const std::string key = std::string("ResourceQuota/") + team;
    ASSERT_TRUE(manifests.count(key)) << path;
    EXPECT_EQ(manifests.at(key)["spec"]["hard"]["requests.nvidia.com/gpu"].as<std::string>(),
              rendered.at(key)["spec"]["hard"]["requests.nvidia.com/gpu"].as<std::string>())
        << path << " disagrees with configs/quota-policy.yaml; run quotad render-k8s";
  }
}

}  // namespace
}  // namespace yolo8::quota
