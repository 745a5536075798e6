// deploy/grafana/dashboard.json: valid dashboard JSON whose queries name only metrics quotad exports.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "quota/server/metrics.h"
#include "quota/server/status_page.h"
#include "tests/quota/server/activity_util.h"

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

  // a live exposition with every kind of lease, so that families without series in a quiet cluster show too
  testing::ScriptedHistory h;
  h.run();
  ASSERT_TRUE(testing::add_shared_and_emergency(h));
  h.metrics_text();
  const std::string text = h.metrics_text();
  std::set<std::string> exported;
  {
    std::istringstream is(text);
    std::string line;
    while (std::getline(is, line)) {
      if (!line.empty() && line[0] != '#') exported.insert(line.substr(0, line.find_first_of("{ ")));
    }
  }
  ASSERT_GT(exported.size(), 40u);

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
  EXPECT_TRUE(used.count("quotad_waste_gpu_seconds"));
  EXPECT_TRUE(used.count("quotad_team_quota_gpus"));
  EXPECT_TRUE(used.count("quotad_job_duration_seconds_bucket"));
  EXPECT_TRUE(used.count("quotad_gpus_allocated"));
  EXPECT_TRUE(used.count("quotad_gpus_free"));
}

TEST(QuotadDashboard, ClusterTotalsMatchTheStatusPageAndTheLeases) {
  testing::ScriptedHistory h;
  h.run();
  ASSERT_TRUE(testing::add_shared_and_emergency(h));
  const auto samples = testing::parse_samples(h.metrics_text());
  // the Cluster GPUs stat: its queries are bare metric names, so their value is the sample's
  std::map<std::string, double> stat;
  const json dashboard = load_dashboard();
  for (const json& p : dashboard.at("panels")) {
    if (p.at("title") != "Cluster GPUs") continue;
    for (const json& t : p.at("targets")) stat[t.at("legendFormat")] = samples.at(t.at("expr").get<std::string>());
  }
  ASSERT_EQ(stat.size(), 5u);
  double leases = 0;
  for (const auto& [key, value] : samples) {
    if (key.rfind("quotad_lease_gpus{", 0) == 0) leases += value;
  }
  // bob's shared lease holds its GPU whole; the lease itself shows (and is billed) its memory share
  EXPECT_DOUBLE_EQ(stat["allocated"], 4 + 6 + 1 + 3);
  EXPECT_DOUBLE_EQ(stat["allocated"], leases - 4.0 / 80 + 1);
  EXPECT_DOUBLE_EQ(stat["allocated"] + stat["free"], stat["total"]);
  EXPECT_DOUBLE_EQ(stat["emergency leases"], 3);
  const std::string page = render_status_page(*h.service);
  EXPECT_NE(page.find("<b>14.00 / 20</b>GPUs in use"), std::string::npos);
  EXPECT_NE(page.find("<b>6.00</b>GPUs free"), std::string::npos);
}

// Every panel of a kind that has data: its targets, unit and columns.
std::vector<json> data_panels(const json& d) {
  std::vector<json> out;
  for (const json& p : d.at("panels")) {
    if (p.at("type") != "row") out.push_back(p);
  }
  return out;
}

TEST(QuotadDashboard, UnitsAPersonReadsWithoutGuessing) {
  const json d = load_dashboard();
  for (const json& p : data_panels(d)) {
    const std::string title = p.at("title");
    const json& defaults = p.at("fieldConfig").at("defaults");
    const std::string unit = defaults.value("unit", "");
    // GiB figures (the _gib metrics) are IEC gibibytes: Grafana's `gbytes`, not the SI `decgbytes`
    EXPECT_NE(unit, "decgbytes") << title;
    bool gib = false;
    for (const json& t : p.at("targets")) gib |= t.at("expr").get<std::string>().find("_gib") != std::string::npos;
    if (gib) {
      EXPECT_EQ(unit, "gbytes") << title;
    }
    if (p.at("type") == "table") {
      // every merged value column gets a name; the scrape's own labels are hidden
      const json* organize = nullptr;
      for (const json& step : p.at("transformations")) {
        if (step.at("id") == "organize") organize = &step;
      }
      ASSERT_NE(organize, nullptr) << title;
      const json& rename = organize->at("options").at("renameByName");
      for (const json& t : p.at("targets")) {
        const std::string column = "Value #" + t.at("refId").get<std::string>();
        EXPECT_TRUE(rename.contains(column)) << title << ": " << column << " has no name";
      }
      EXPECT_TRUE(rename.contains("job_name")) << title;
      for (const char* hidden : {"Time", "__name__", "instance", "job"}) {
        EXPECT_TRUE(organize->at("options").at("excludeByName").value(hidden, false)) << title << ": " << hidden;
      }
      continue;
    }
    // one unit per axis: a graph with several queries has one unit for all of them (no per-series unit)
    EXPECT_FALSE(unit.empty()) << title << " has no unit";
    for (const json& o : p.at("fieldConfig").at("overrides")) {
      for (const json& property : o.at("properties")) EXPECT_NE(property.at("id"), "unit") << title;
    }
  }
}

// A share of a whole (utilisation, credit used) scales to 100 %: without `max`, Grafana scales a bar gauge to its
// largest value, so the heaviest member's bar looks full however far under the credit it is.
TEST(QuotadDashboard, SharesScaleToAWhole) {
  const json d = load_dashboard();
  int shares = 0;
  for (const json& p : data_panels(d)) {
    const json& defaults = p.at("fieldConfig").at("defaults");
    if (defaults.value("unit", "") != "percentunit") continue;
    ++shares;
    const std::string title = p.at("title");
    EXPECT_EQ(defaults.value("min", -1.0), 0.0) << title;
    EXPECT_EQ(defaults.value("max", -1.0), 1.0) << title;
  }
  EXPECT_GE(shares, 3);
}

TEST(QuotadDashboard, RequiresNamesEveryPanelTypeAndTheDataSource) {
  const json d = load_dashboard();
  std::set<std::string> required;
  for (const json& r : d.at("__requires"))
    required.insert(r.at("type").get<std::string>() + ":" + r.at("id").get<std::string>());
  EXPECT_TRUE(required.count("grafana:grafana"));
  EXPECT_TRUE(required.count("datasource:prometheus"));
  for (const json& p : data_panels(d)) {
    EXPECT_TRUE(required.count("panel:" + p.at("type").get<std::string>())) << p.at("type");
  }
}

TEST(QuotadDashboard, NoQueryUsesTheScrapeJobLabel) {
  // Prometheus owns `job` (the scrape job); quotad's job names are `job_name`
  const json d = load_dashboard();
  std::vector<std::string> queries;
  collect_queries(d, queries);
  const std::regex job_label(R"((\bjob\s*[=!]~?|by\s*\([^)]*\bjob\b|\{\{\s*job\s*\}\}))");
  for (const auto& q : queries) EXPECT_FALSE(std::regex_search(q, job_label)) << q;
  for (const json& p : data_panels(d)) {
    for (const json& t : p.at("targets")) {
      EXPECT_EQ(t.value("legendFormat", "").find("{{job}}"), std::string::npos) << p.at("title");
    }
  }
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
