// deploy/prometheus: the PrometheusRule object carries exactly the groups of the plain rules file (promtool checks
// and unit-tests the plain file; CTest DeployPrometheus.*), so the two ways of loading the rules never drift.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <map>
#include <set>
#include <string>

#include "test_paths.h"

namespace yolo8 {
namespace {

namespace fs = std::filesystem;

fs::path prometheus_dir() { return fs::path(test::kSourceDir) / "deploy" / "prometheus"; }

// A canonical text of a YAML tree: mappings with sorted keys, scalars quoted, so that layout, comments and
// quoting styles do not count, values do.
std::string canonical(const YAML::Node& node) {
  switch (node.Type()) {
    case YAML::NodeType::Map: {
      std::map<std::string, std::string> entries;
      for (const auto& entry : node) entries[entry.first.as<std::string>()] = canonical(entry.second);
      std::string out = "{";
      for (const auto& [key, value] : entries) out += "\"" + key + "\":" + value + ",";
      return out + "}";
    }
    case YAML::NodeType::Sequence: {
      std::string out = "[";
      for (const auto& item : node) out += canonical(item) + ",";
      return out + "]";
    }
    case YAML::NodeType::Scalar: return "\"" + node.Scalar() + "\"";
    default: return "null";
  }
}

TEST(DeployPrometheus, RuleObjectHasTheRulesFileGroups) {
  const YAML::Node plain = YAML::LoadFile((prometheus_dir() / "quotad-rules.yaml").string());
  const YAML::Node object = YAML::LoadFile((prometheus_dir() / "prometheusrule.yaml").string());
  ASSERT_EQ(object["kind"].as<std::string>(), "PrometheusRule");
  ASSERT_TRUE(plain["groups"].IsSequence());
  ASSERT_GE(plain["groups"].size(), 2u);
  EXPECT_EQ(plain.size(), 1u) << "the plain file holds only `groups`";
  EXPECT_EQ(object["spec"].size(), 1u) << "the object's spec holds only `groups`";
  EXPECT_EQ(canonical(object["spec"]["groups"]), canonical(plain["groups"]));
}

TEST(DeployPrometheus, EveryAlertTheIssueAsksForIsThere) {
  const YAML::Node plain = YAML::LoadFile((prometheus_dir() / "quotad-rules.yaml").string());
  std::set<std::string> alerts;
  for (const auto& group : plain["groups"]) {
    for (const auto& rule : group["rules"]) {
      if (rule["alert"]) {
        alerts.insert(rule["alert"].as<std::string>());
        EXPECT_TRUE(rule["labels"]["severity"]) << rule["alert"].as<std::string>() << " has no severity";
        EXPECT_TRUE(rule["annotations"]["summary"]) << rule["alert"].as<std::string>() << " has no summary";
      }
    }
  }
  for (const char* wanted :
       {"QuotadDown", "QuotadHeartbeatsFailing", "QuotadLeaseHeartbeatsMissing", "QuotadTeamOverQuota",
        "QuotadJobLowGpuUtilization", "QuotadEmergencyLeaseUnreviewed", "QuotadStorageWriteErrors", "QuotadBackupStale",
        "QuotadCertificateExpiresSoon", "QuotadReloadFailed"}) {
    EXPECT_TRUE(alerts.count(wanted)) << wanted;
  }
}

TEST(DeployPrometheus, CanonicalFormSeesAChangedExpression) {
  // the comparison above can fail: one changed character in one expression differs
  const YAML::Node plain = YAML::LoadFile((prometheus_dir() / "quotad-rules.yaml").string());
  YAML::Node changed = YAML::Clone(plain);
  changed["groups"][1]["rules"][0]["expr"] = plain["groups"][1]["rules"][0]["expr"].as<std::string>() + " ";
  EXPECT_NE(canonical(changed["groups"]), canonical(plain["groups"]));
  EXPECT_EQ(canonical(YAML::Clone(plain)["groups"]), canonical(plain["groups"]));
}

}  // namespace
}  // namespace yolo8
