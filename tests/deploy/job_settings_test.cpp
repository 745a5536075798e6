// The training Jobs' arguments are valid yolo8 settings: a typo there would make every pod exit 2,
// which the Job turns into FailJob. Kubernetes' $(VAR) expansion is applied from the container env first.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "test_paths.h"
#include "trainer/cli/settings.h"

namespace yolo8 {
namespace {

namespace fs = std::filesystem;

// $(NAME) replaced by the container's literal env value, as the kubelet does.
std::string expand(std::string arg, const YAML::Node& env) {
  for (const auto& var : env) {
    if (!var["value"].IsDefined()) continue;
    const std::string ref = "$(" + var["name"].as<std::string>() + ")";
    for (auto at = arg.find(ref); at != std::string::npos; at = arg.find(ref)) {
      arg.replace(at, ref.size(), var["value"].as<std::string>());
    }
  }
  return arg;
}

TEST(DeployJobSettings, JobArgumentsResolveAsTrainSettings) {
  int jobs = 0;
  for (const auto& entry : fs::recursive_directory_iterator(fs::path(test::kSourceDir) / "deploy" / "k8s")) {
    if (entry.path().extension() != ".yaml") continue;
    for (const auto& doc : YAML::LoadAllFromFile(entry.path().string())) {
      if (doc["kind"].as<std::string>("") != "Job") continue;
      SCOPED_TRACE(entry.path().string());
      ++jobs;
      const YAML::Node trainer = doc["spec"]["template"]["spec"]["containers"][0];
      ASSERT_EQ(trainer["name"].as<std::string>(), "trainer");
      std::vector<std::pair<std::string, std::string>> pairs;
      bool first = true;
      for (const auto& node : trainer["args"]) {
        const std::string arg = expand(node.as<std::string>(), trainer["env"]);
        if (first) {
          EXPECT_EQ(arg, "train");
          first = false;
          continue;
        }
        const auto eq = arg.find('=');
        ASSERT_NE(eq, std::string::npos) << arg;
        pairs.emplace_back(arg.substr(0, eq), arg.substr(eq + 1));
      }
      Settings settings;
      ASSERT_NO_THROW(settings = resolve_settings(pairs, "train"));
      EXPECT_EQ(settings.resume, "auto");
      EXPECT_EQ(settings.lease.quota, "http://quotad.yolo8-system.svc.cluster.local:8080");
      EXPECT_EQ(settings.lease.team, doc["metadata"]["namespace"].as<std::string>());
      EXPECT_EQ(settings.project, "/runs");
      EXPECT_FALSE(settings.name.empty());
    }
  }
  EXPECT_EQ(jobs, 3);
}

}  // namespace
}  // namespace yolo8
