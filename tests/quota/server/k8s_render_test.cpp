#include "quota/server/k8s_render.h"

#include <unistd.h>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

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

// The example policy with one team renamed (the policy structs, so that the renderer's own check is what refuses).
Policy with_team_named(const std::string& name) {
  Policy policy = load_policy(kPolicyPath);
  auto team = policy.teams.extract("team-interns");
  team.key() = name;
  team.mapped().name = name;
  policy.teams.insert(std::move(team));
  return policy;
}

TEST(RenderK8s, RefusesATeamNameThatIsNotADns1123Label) {
  const std::vector<std::string> bad_names = {"Team_Interns", "team.interns",       "-interns",
                                              "interns-",     std::string(64, 'a'), ""};
  for (const std::string& bad : bad_names) {
    SCOPED_TRACE(bad);
    try {
      render_k8s(with_team_named(bad));
      FAIL() << "rendered a Namespace named '" << bad << "'";
    } catch (const std::invalid_argument& error) {
      const std::string what = error.what();
      EXPECT_NE(what.find("team '" + bad + "'"), std::string::npos) << what;  // names the team
      EXPECT_NE(what.find("DNS-1123 label"), std::string::npos) << what;      // and the rule
    }
  }
  for (const std::string& good : std::vector<std::string>{"interns", "team-2", "a", std::string(63, 'a')}) {
    EXPECT_NO_THROW(render_k8s(with_team_named(good))) << good;
  }
}

TEST(RenderK8s, CommandWritesNothingForAnInvalidName) {
  const std::string dir = std::string(test::kBinaryDir) + "/quota_test_tmp/render_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::ifstream in(kPolicyPath);
  std::stringstream text;
  text << in.rdbuf();
  std::string policy = text.str();
  for (size_t at = policy.find("team-interns"); at != std::string::npos; at = policy.find("team-interns", at)) {
    policy.replace(at, 12, "Team_Interns");
  }
  const std::string policy_path = dir + "/policy.yaml";
  std::ofstream(policy_path) << policy;
  std::filesystem::copy_file(std::string(test::kSourceDir) + "/configs/memory-table.yaml", dir + "/memory-table.yaml",
                             std::filesystem::copy_options::overwrite_existing);
  const std::string out = dir + "/rendered.yaml";
  std::filesystem::remove(out);
  const std::string command = std::string(test::kBinaryDir) + "/quota/quotad render-k8s --policy " + policy_path +
                              " --out " + out + " 2> " + dir + "/stderr.txt";
  EXPECT_NE(std::system(command.c_str()), 0) << command;
  EXPECT_FALSE(std::filesystem::exists(out)) << "wrote " << out;
  std::ifstream err(dir + "/stderr.txt");
  std::stringstream message;
  message << err.rdbuf();
  EXPECT_NE(message.str().find("Team_Interns"), std::string::npos) << message.str();
}

TEST(RenderK8s, EmitsQuantitiesAsStringsAndOneObjectPerDocument) {
  const std::string text = render_k8s(load_policy(kPolicyPath));
  const auto docs = YAML::LoadAll(text);
  ASSERT_EQ(docs.size(), 3 * load_policy(kPolicyPath).teams.size());
  for (const YAML::Node& doc : docs) {
    ASSERT_TRUE(doc.IsMap());
    EXPECT_TRUE(doc["apiVersion"] && doc["kind"] && doc["metadata"]["name"]);
  }
  EXPECT_NE(text.find("requests.nvidia.com/gpu: \"14\""), std::string::npos) << text;
}

}  // namespace
}  // namespace yolo8::quota
