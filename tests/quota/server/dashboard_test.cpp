// deploy/grafana/dashboard.json: valid dashboard JSON whose queries name only metrics quotad exports.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "quota/server/metrics.h"
#include "tests/quota/visibility_util.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;

json load_dashboard() {
  const std::string path = std::string(yolo8::test::kSourceDir) + "/deploy/grafana/dashboard.json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error(path + ": cannot open");
  return json::parse(in);
}

// Every PromQL text in the dashboard: panel target `expr`s (rows nest panels) and query variables.
void collect_exprs(const json& j, std::vector<std::string>& out) {
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "expr" && it.value().is_string()) out.push_back(it.value().get<std::string>());
      collect_exprs(it.value(), out);
    }
  } else if (j.is_array()) {
    for (const auto& v : j) collect_exprs(v, out);
  }
}

void collect_queries(const json& d, std::vector<std::string>& out) {
  collect_exprs(d.at("panels"), out);
  for (const json& v : d.at("templating").at("list")) {
    if (v.at("type") != "query") continue;
    out.push_back(v.at("definition").get<std::string>());
    if (v.at("query").is_object()) out.push_back(v["query"].at("query").get<std::string>());
  }
}

// Names in a real exposition: TYPE lines and sample names (histogram series included).
std::set<std::string> names_in_exposition(const std::string& text) {
  std::set<std::string> names;
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      names.insert(line.substr(7, line.find(' ', 7) - 7));
    } else if (!line.empty() && line[0] != '#') {
      names.insert(line.substr(0, line.find_first_of("{ ")));
    }
  }
  return names;
}

TEST(QuotadDashboard, IsAGrafanaDashboard) {
  const json d = load_dashboard();
  EXPECT_TRUE(d.at("title").is_string());
  EXPECT_TRUE(d.at("uid").is_string());
  EXPECT_TRUE(d.at("schemaVersion").is_number_integer());
  ASSERT_TRUE(d.at("panels").is_array());
  std::set<int> ids;
  std::set<std::string> titles;
  for (const json& p : d["panels"]) {
    EXPECT_TRUE(ids.insert(p.at("id").get<int>()).second) << "duplicate panel id " << p["id"];
    const json& g = p.at("gridPos");
    EXPECT_GE(g.at("x").get<int>(), 0);
    EXPECT_LE(g.at("x").get<int>() + g.at("w").get<int>(), 24) << p["title"];
    EXPECT_GT(g.at("h").get<int>(), 0);
    titles.insert(p.at("title").get<std::string>());
    if (p.at("type") == "row") continue;
    ASSERT_TRUE(p.at("targets").is_array()) << p["title"];
    EXPECT_FALSE(p["targets"].empty()) << p["title"];
    std::set<std::string> refs;
    for (const json& t : p["targets"]) {
      EXPECT_FALSE(t.at("expr").get<std::string>().empty());
      EXPECT_TRUE(refs.insert(t.at("refId").get<std::string>()).second);
    }
  }
  // the three views the issue asks for
  EXPECT_TRUE(titles.count("GPUs in use vs quota in force, per team"));
  EXPECT_TRUE(titles.count("Job duration (ended leases)"));
  EXPECT_TRUE(titles.count("GPU utilisation per team (efficiency)"));
  EXPECT_TRUE(titles.count("Waste leaderboard"));
}

TEST(QuotadDashboard, EveryQueryNamesAnExportedMetric) {
  const json d = load_dashboard();
  std::vector<std::string> queries;
  collect_queries(d, queries);
  ASSERT_GE(queries.size(), 20u);

  testing::ScriptedHistory h;
  h.run();
  const std::set<std::string> exported = names_in_exposition(h.metrics_text());
  ASSERT_GT(exported.size(), 30u);

  const std::regex token("quotad_[a-z0-9_]+");
  std::set<std::string> used;
  for (const auto& q : queries) {
    int found = 0;
    for (auto it = std::sregex_iterator(q.begin(), q.end(), token); it != std::sregex_iterator(); ++it) {
      const std::string name = it->str();
      EXPECT_TRUE(exported.count(name)) << "'" << name << "' in \"" << q << "\" is not exported by /metrics";
      used.insert(name);
      ++found;
    }
    EXPECT_GT(found, 0) << "query names no quotad metric: " << q;
  }
  // the waste list and the quota in force are on the dashboard
  EXPECT_TRUE(used.count("quotad_waste_gpu_hours"));
  EXPECT_TRUE(used.count("quotad_team_quota_gpus"));
  EXPECT_TRUE(used.count("quotad_job_duration_seconds_bucket"));
}

TEST(QuotadDashboard, CheckerCatchesAnUnknownMetric) {
  // the same extraction flags a misspelt name
  const std::string q = "sum(quotad_team_gpus_in_uze)";
  testing::ScriptedHistory h;
  const std::set<std::string> exported = names_in_exposition(h.metrics_text());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(q, m, std::regex("quotad_[a-z0-9_]+")));
  EXPECT_FALSE(exported.count(m.str()));
  EXPECT_TRUE(exported.count("quotad_team_gpus_in_use"));
}

TEST(QuotadPolicy, WasteThresholdsDefaultAndLoad) {
  const Policy p = testing::example_policy();
  EXPECT_DOUBLE_EQ(p.waste_gpu_util_below, 0.20);
  EXPECT_EQ(p.waste_after_s, 3600);
  std::ifstream in(testing::example_policy_path());
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string base_dir = std::string(yolo8::test::kSourceDir) + "/configs";
  const Policy q =
      load_policy_from_string(ss.str() + "\nwaste: {gpu_util_below: 0.1, after_s: 1800}\n", "p.yaml", base_dir);
  EXPECT_DOUBLE_EQ(q.waste_gpu_util_below, 0.1);
  EXPECT_EQ(q.waste_after_s, 1800);
  try {
    load_policy_from_string(ss.str() + "\nwaste: {gpu_util_below: 1.5}\n", "p.yaml", base_dir);
    FAIL() << "accepted 1.5";
  } catch (const PolicyError& e) {
    EXPECT_NE(std::string(e.what()).find("waste.gpu_util_below"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_policy_from_string(ss.str() + "\nwaste: {after: 10}\n", "p.yaml", base_dir), PolicyError);
}

}  // namespace
}  // namespace yolo8::quota
