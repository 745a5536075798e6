// Checks deploy/ by reading it: every manifest parses and carries the fields the exit-code contract,
// the quota policy and the single-writer quotad rely on; the Dockerfile keeps its stages and non-root user.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "test_paths.h"

namespace yolo8 {
namespace {

namespace fs = std::filesystem;

// node[k1][k2]...; an undefined node when any key is missing (yaml-cpp throws on chained misses).
YAML::Node dig(const YAML::Node& node, std::initializer_list<std::string> keys) {
  YAML::Node current = node;
  for (const auto& key : keys) {
    const YAML::Node& view = current;  // const lookups never insert keys
    if (!view.IsMap() || !view[key].IsDefined()) return YAML::Node(YAML::NodeType::Undefined);
    current.reset(view[key]);  // rebinds; operator= would overwrite the shared node
  }
  return current;
}

struct Object {
  std::string file;  // relative to deploy/
  YAML::Node node;
  std::string kind() const { return node["kind"].as<std::string>(""); }
  std::string name() const { return dig(node, {"metadata", "name"}).as<std::string>(""); }
  std::string ns() const { return dig(node, {"metadata", "namespace"}).as<std::string>(""); }
  // quotad's high-availability variant, which takes the place of the platform's quotad Deployment and PVC.
  bool ha() const { return file.rfind("k8s/quotad-ha/", 0) == 0; }
};

fs::path deploy_dir() { return fs::path(test::kSourceDir) / "deploy"; }

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<fs::path> yaml_files() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::recursive_directory_iterator(deploy_dir())) {
    const std::string ext = entry.path().extension().string();
    if (entry.is_regular_file() && (ext == ".yaml" || ext == ".yml")) files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// A plain Prometheus rules file (deploy/prometheus/quotad-rules.yaml): YAML, but no Kubernetes object.
bool prometheus_rules_file(const YAML::Node& doc) { return doc.IsMap() && doc["groups"] && !doc["apiVersion"]; }

// Every non-empty document of every YAML file under deploy/ that is a Kubernetes object (or a kustomization).
const std::vector<Object>& objects() {
  static const std::vector<Object> all = [] {
    std::vector<Object> out;
    for (const auto& path : yaml_files()) {
      for (const auto& doc : YAML::LoadAllFromFile(path.string())) {
        if (!doc.IsNull() && !prometheus_rules_file(doc))
          out.push_back({fs::relative(path, deploy_dir()).string(), doc});
      }
    }
    return out;
  }();
  return all;
}

std::vector<Object> of_kind(const std::string& kind) {
  std::vector<Object> out;
  for (const auto& o : objects()) {
    if (o.kind() == kind) out.push_back(o);
  }
  return out;
}

// An object of the platform (`ha` false) or of quotad's HA variant (`ha` true).
const Object* find_object(const std::string& kind, const std::string& ns, const std::string& name, bool ha = false) {
  for (const auto& o : objects()) {
    if (o.kind() == kind && o.ns() == ns && o.name() == name && o.ha() == ha) return &o;
  }
  return nullptr;
}

// Kubernetes quantities as plain numbers: "14", "500m", "256Gi", "2G".
double quantity(const YAML::Node& node) {
  const std::string s = node.as<std::string>("");
  static const std::vector<std::pair<std::string, double>> kSuffixes = {{"Ki", 1024.0},
                                                                        {"Mi", 1024.0 * 1024},
                                                                        {"Gi", 1024.0 * 1024 * 1024},
                                                                        {"Ti", 1024.0 * 1024 * 1024 * 1024},
                                                                        {"k", 1e3},
                                                                        {"M", 1e6},
                                                                        {"G", 1e9},
                                                                        {"T", 1e12},
                                                                        {"m", 1e-3}};
  for (const auto& [suffix, scale] : kSuffixes) {
    if (s.size() > suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return std::stod(s.substr(0, s.size() - suffix.size())) * scale;
    }
  }
  size_t used = 0;
  const double value = s.empty() ? NAN : std::stod(s, &used);
  if (s.empty() || used != s.size()) throw std::runtime_error("not a quantity: '" + s + "'");
  return value;
}

// The quota policy quotad is given, parsed from its ConfigMap.
YAML::Node policy() {
  const Object* cm = find_object("ConfigMap", "yolo8-system", "quotad-policy");
  if (cm == nullptr) throw std::runtime_error("ConfigMap yolo8-system/quotad-policy is missing");
  return YAML::Load(cm->node["data"]["quota-policy.yaml"].as<std::string>());
}

int inventory_gpus(const YAML::Node& pol) {
  int total = 0;
  for (const auto& node : pol["inventory"]["nodes"]) total += node["gpus"].as<int>();
  return total;
}

YAML::Node container(const YAML::Node& pod_spec, const std::string& name) {
  for (const auto& c : pod_spec["containers"]) {
    if (c["name"].as<std::string>("") == name) return c;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

YAML::Node env_var(const YAML::Node& c, const std::string& name) {
  for (const auto& e : c["env"]) {
    if (e["name"].as<std::string>("") == name) return e;
  }
  return YAML::Node(YAML::NodeType::Undefined);
}

std::vector<std::string> strings(const YAML::Node& seq) {
  std::vector<std::string> out;
  for (const auto& item : seq) out.push_back(item.as<std::string>());
  return out;
}

bool contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// Labels in `selector` all present with the same values in `labels`.
bool selects(const YAML::Node& selector, const YAML::Node& labels) {
  if (!selector.IsMap() || selector.size() == 0) return false;
  for (const auto& kv : selector) {
    if (labels[kv.first.as<std::string>()].as<std::string>("") != kv.second.as<std::string>()) return false;
  }
  return true;
}

TEST(DeployManifests, EveryYamlFileParses) {
  const auto files = yaml_files();
  ASSERT_GE(files.size(), 12u) << "deploy/ lost its manifests";
  for (const auto& path : files) {
    SCOPED_TRACE(path.string());
    std::vector<YAML::Node> docs;
    ASSERT_NO_THROW(docs = YAML::LoadAllFromFile(path.string()));
    int non_empty = 0;
    for (const auto& doc : docs) {
      if (doc.IsNull()) continue;
      ++non_empty;
      EXPECT_TRUE(doc.IsMap()) << "a document is not a mapping";
    }
    EXPECT_GE(non_empty, 1) << "no document";
  }
}

TEST(DeployManifests, EveryObjectHasApiVersionKindAndName) {
  std::set<std::string> seen;
  for (const auto& o : objects()) {
    SCOPED_TRACE(o.file);
    EXPECT_FALSE(o.node["apiVersion"].as<std::string>("").empty()) << "apiVersion missing";
    EXPECT_FALSE(o.kind().empty()) << "kind missing";
    if (o.kind() == "Kustomization") continue;  // a kustomize file, not an API object
    EXPECT_FALSE(o.name().empty()) << o.kind() << " without metadata.name";
    // the HA variant's objects replace the platform's of the same name
    EXPECT_TRUE(seen.insert(std::string(o.ha() ? "ha:" : "") + o.kind() + "/" + o.ns() + "/" + o.name()).second)
        << "duplicate " << o.kind() << " " << o.ns() << "/" << o.name();
  }
  EXPECT_GE(seen.size(), 25u);
}

TEST(DeployManifests, KustomizationsListEveryObjectFileButTheJobTemplates) {
  std::set<std::string> listed;
  const auto kustomizations = of_kind("Kustomization");
  // the platform, the Kueue variant, the Prometheus Operator's rules and quotad's HA variant
  ASSERT_EQ(kustomizations.size(), 4u);
  for (const auto& k : kustomizations) {
    const fs::path dir = (deploy_dir() / k.file).parent_path();
    for (const auto& res : strings(k.node["resources"])) {
      EXPECT_TRUE(fs::is_regular_file(dir / res)) << k.file << " lists missing " << res;
      listed.insert(fs::relative(dir / res, deploy_dir()).lexically_normal().string());
    }
  }
  for (const auto& o : objects()) {
    if (o.kind() == "Kustomization") continue;
    // Job templates (and the Service that goes with the indexed one) are created per run, not applied.
    const bool template_file = o.file.find("job") != std::string::npos;
    EXPECT_EQ(listed.count(o.file) > 0, !template_file) << o.file;
  }
}

// The Jobs (plain, indexed, Kueue) all follow yolo8's exit-code contract.
TEST(DeployManifests, TrainingJobsFollowTheExitCodeContract) {
  const auto jobs = of_kind("Job");
  ASSERT_EQ(jobs.size(), 3u);
  std::set<std::string> priority_classes;
  for (const auto& pc : of_kind("PriorityClass")) priority_classes.insert(pc.name());
  for (const auto& job : jobs) {
    SCOPED_TRACE(job.file);
    const YAML::Node spec = job.node["spec"];
    const YAML::Node pod = spec["template"]["spec"];
    const YAML::Node trainer = container(pod, "trainer");
    ASSERT_TRUE(trainer.IsDefined()) << "no container named trainer";

    bool ignore_75 = false, fail_2 = false, ignore_disruption = false;
    for (const auto& rule : spec["podFailurePolicy"]["rules"]) {
      const std::string action = rule["action"].as<std::string>("");
      if (const YAML::Node codes = rule["onExitCodes"]; codes.IsDefined()) {
        EXPECT_EQ(codes["containerName"].as<std::string>(""), "trainer");
        EXPECT_EQ(codes["operator"].as<std::string>(""), "In");
        std::vector<int> values;
        for (const auto& v : codes["values"]) values.push_back(v.as<int>());
        // 0 is success and 1 must count against backoffLimit: no rule may catch them.
        EXPECT_EQ(std::count(values.begin(), values.end(), 0), 0);
        EXPECT_EQ(std::count(values.begin(), values.end(), 1), 0);
        if (values == std::vector<int>{75}) ignore_75 = action == "Ignore";
        if (values == std::vector<int>{2}) fail_2 = action == "FailJob";
      }
      for (const auto& cond : rule["onPodConditions"]) {
        // The schema requires status; "True" is a pod that was disrupted (a "False" rule would never match).
        if (cond["type"].as<std::string>("") == "DisruptionTarget") {
          ignore_disruption = action == "Ignore" && cond["status"].as<std::string>("") == "True";
        }
      }
    }
    EXPECT_TRUE(ignore_75) << "exit 75 (preempted) must be ignored";
    EXPECT_TRUE(fail_2) << "exit 2 (bad settings) must fail the Job";
    EXPECT_TRUE(ignore_disruption) << "DisruptionTarget (status True) must be ignored";

    EXPECT_GE(spec["backoffLimit"].as<int>(-1), 1);
    EXPECT_EQ(pod["restartPolicy"].as<std::string>(""), "Never");
    EXPECT_GE(pod["terminationGracePeriodSeconds"].as<int>(0), 60);
    EXPECT_EQ(priority_classes.count(pod["priorityClassName"].as<std::string>("")), 1u);

    const auto args = strings(trainer["args"]);
    ASSERT_FALSE(args.empty());
    EXPECT_EQ(args.front(), "train");
    EXPECT_TRUE(contains(args, "resume=auto"));
    EXPECT_TRUE(contains(args, "quota=$(YOLO8_QUOTA_URL)"));
    EXPECT_TRUE(std::any_of(args.begin(), args.end(), [](const std::string& a) { return a.rfind("name=", 0) == 0; }))
        << "resume=auto needs a fixed run name";
    const std::string team = job.ns();
    EXPECT_TRUE(contains(args, "team=" + team));
    EXPECT_EQ(dig(env_var(trainer, "YOLO8_QUOTA_URL"), {"value"}).as<std::string>(""),
              "http://quotad.yolo8-system.svc.cluster.local:8080");
    // the lease request names the node the device plugin's GPUs are on
    EXPECT_EQ(dig(env_var(trainer, "NODE_NAME"), {"valueFrom", "fieldRef", "fieldPath"}).as<std::string>(""),
              "spec.nodeName");

    // The token Secret and the run volumes exist in the Job's namespace.
    const YAML::Node token = dig(env_var(trainer, "YOLO8_QUOTA_TOKEN"), {"valueFrom", "secretKeyRef"});
    const Object* secret = find_object("Secret", team, token["name"].as<std::string>(""));
    ASSERT_NE(secret, nullptr) << "token Secret missing in " << team;
    EXPECT_TRUE(secret->node["stringData"][token["key"].as<std::string>("")].IsDefined());
    bool runs_mounted = false;
    for (const auto& vol : pod["volumes"]) {
      if (const YAML::Node claim = vol["persistentVolumeClaim"]; claim.IsDefined()) {
        EXPECT_NE(find_object("PersistentVolumeClaim", team, claim["claimName"].as<std::string>("")), nullptr)
            << "PVC " << claim["claimName"] << " missing in " << team;
      }
    }
    for (const auto& mount : trainer["volumeMounts"]) {
      runs_mounted |= mount["mountPath"].as<std::string>("") == "/runs";
    }
    EXPECT_TRUE(runs_mounted);
    EXPECT_TRUE(contains(args, "project=/runs"));
    EXPECT_EQ(quantity(trainer["resources"]["limits"]["nvidia.com/gpu"]),
              quantity(trainer["resources"]["requests"]["nvidia.com/gpu"]));
  }
}

TEST(DeployManifests, QuotadIsOneReplicaRecreateWithHealthProbes) {
  const Object* dep = find_object("Deployment", "yolo8-system", "quotad");
  ASSERT_NE(dep, nullptr);
  const YAML::Node spec = dep->node["spec"];
  EXPECT_EQ(spec["replicas"].as<int>(0), 1);
  EXPECT_EQ(spec["strategy"]["type"].as<std::string>(""), "Recreate");
  const YAML::Node pod = spec["template"]["spec"];
  const YAML::Node c = container(pod, "quotad");
  ASSERT_TRUE(c.IsDefined());
  for (const char* probe : {"readinessProbe", "livenessProbe", "startupProbe"}) {
    EXPECT_EQ(c[probe]["httpGet"]["path"].as<std::string>(""), "/healthz") << probe;
    EXPECT_EQ(c[probe]["httpGet"]["port"].as<std::string>(""), "http") << probe;
  }
  for (const char* kind : {"requests", "limits"}) {
    EXPECT_GT(quantity(c["resources"][kind]["memory"]), 0) << kind;
    EXPECT_GT(quantity(c["resources"][kind]["cpu"]), 0) << kind;
  }

  // serve --policy FILE --db FILE --listen HOST:PORT, each path on the right volume.
  const auto args = strings(c["args"]);
  ASSERT_EQ(args.size(), 7u);
  EXPECT_EQ(args[0], "serve");
  std::map<std::string, std::string> flags;
  for (size_t i = 1; i + 1 < args.size(); i += 2) flags[args[i]] = args[i + 1];
  std::map<std::string, std::string> mount_of_volume;
  for (const auto& m : c["volumeMounts"]) {
    mount_of_volume[m["name"].as<std::string>()] = m["mountPath"].as<std::string>();
  }
  std::string policy_dir, tokens_dir, state_dir;
  for (const auto& vol : pod["volumes"]) {
    const std::string mount = mount_of_volume[vol["name"].as<std::string>()];
    if (dig(vol, {"configMap", "name"}).as<std::string>("") == "quotad-policy") policy_dir = mount;
    if (dig(vol, {"secret", "secretName"}).as<std::string>("") == "quotad-tokens") tokens_dir = mount;
    if (dig(vol, {"persistentVolumeClaim", "claimName"}).as<std::string>("") == "quotad-state") state_dir = mount;
  }
  ASSERT_FALSE(policy_dir.empty());
  ASSERT_FALSE(tokens_dir.empty());
  ASSERT_FALSE(state_dir.empty());
  EXPECT_EQ(flags["--policy"], policy_dir + "/quota-policy.yaml");
  EXPECT_EQ(flags["--db"].rfind(state_dir + "/", 0), 0u) << "the database must live on the PVC";
  const std::string tokens_file = dig(env_var(c, "QUOTAD_TOKENS_FILE"), {"value"}).as<std::string>("");
  EXPECT_EQ(tokens_file.rfind(tokens_dir + "/", 0), 0u);
  const Object* secret = find_object("Secret", "yolo8-system", "quotad-tokens");
  ASSERT_NE(secret, nullptr);
  EXPECT_TRUE(secret->node["stringData"][tokens_file.substr(tokens_dir.size() + 1)].IsDefined());
  const Object* state = find_object("PersistentVolumeClaim", "yolo8-system", "quotad-state");
  ASSERT_NE(state, nullptr);
  EXPECT_EQ(strings(state->node["spec"]["accessModes"]), std::vector<std::string>{"ReadWriteOnce"});

  // The Service reaches the pod on the port the Jobs use.
  const Object* svc = find_object("Service", "yolo8-system", "quotad");
  ASSERT_NE(svc, nullptr);
  EXPECT_TRUE(selects(svc->node["spec"]["selector"], spec["template"]["metadata"]["labels"]));
  EXPECT_EQ(svc->node["spec"]["ports"][0]["port"].as<int>(0), 8080);
  EXPECT_EQ(flags["--listen"], "0.0.0.0:8080");

  // Users with tokens are users of the policy.
  const YAML::Node tokens = YAML::Load(secret->node["stringData"]["tokens.yaml"].as<std::string>());
  const YAML::Node pol = policy();
  for (const auto& kv : tokens["users"]) {
    EXPECT_TRUE(pol["users"][kv.first.as<std::string>()].IsDefined()) << kv.first;
  }
}

// quotad's HA variant: two replicas on PostgreSQL, one per node, ready only while serving the state, the database
// password from a Secret's file only, no volume, hardened as the single replica is.
TEST(DeployManifests, QuotadHaIsTwoReplicasOnPostgresqlReadyOnlyWhileServing) {
  const Object* dep = find_object("Deployment", "yolo8-system", "quotad", true);
  const Object* single = find_object("Deployment", "yolo8-system", "quotad");
  ASSERT_NE(dep, nullptr);
  ASSERT_NE(single, nullptr);
  const YAML::Node spec = dep->node["spec"];
  EXPECT_EQ(spec["replicas"].as<int>(0), 2);
  const YAML::Node labels = spec["template"]["metadata"]["labels"];
  EXPECT_TRUE(selects(spec["selector"]["matchLabels"], labels));
  const YAML::Node pod = spec["template"]["spec"];
  const YAML::Node c = container(pod, "quotad");
  ASSERT_TRUE(c.IsDefined());
  EXPECT_EQ(c["image"].as<std::string>(""),
            container(single->node["spec"]["template"]["spec"], "quotad")["image"].as<std::string>("x"));

  // readiness (/readyz) takes a follower out of the Service; liveness (/healthz) only asks that the process answers
  EXPECT_EQ(dig(c, {"readinessProbe", "httpGet", "path"}).as<std::string>(""), "/readyz");
  EXPECT_EQ(dig(c, {"livenessProbe", "httpGet", "path"}).as<std::string>(""), "/healthz");
  EXPECT_EQ(dig(c, {"startupProbe", "httpGet", "path"}).as<std::string>(""), "/healthz");
  const Object* svc = find_object("Service", "yolo8-system", "quotad");
  ASSERT_NE(svc, nullptr);
  EXPECT_TRUE(selects(svc->node["spec"]["selector"], labels));
  EXPECT_FALSE(svc->node["spec"]["publishNotReadyAddresses"].as<bool>(false)) << "followers would get traffic";

  // one replica per node
  YAML::Node term(YAML::NodeType::Undefined);
  const YAML::Node required =
      dig(pod, {"affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution"});
  const YAML::Node preferred =
      dig(pod, {"affinity", "podAntiAffinity", "preferredDuringSchedulingIgnoredDuringExecution"});
  if (required.IsSequence() && required.size() > 0) term.reset(required[0]);
  if (!term.IsDefined() && preferred.IsSequence() && preferred.size() > 0) {
    term.reset(dig(preferred[0], {"podAffinityTerm"}));
  }
  ASSERT_TRUE(term.IsDefined()) << "no pod anti-affinity";
  EXPECT_EQ(term["topologyKey"].as<std::string>(""), "kubernetes.io/hostname");
  EXPECT_TRUE(selects(term["labelSelector"]["matchLabels"], labels));

  // voluntary evictions leave one replica
  const Object* pdb = find_object("PodDisruptionBudget", "yolo8-system", "quotad", true);
  ASSERT_NE(pdb, nullptr);
  EXPECT_EQ(pdb->node["spec"]["minAvailable"].as<int>(0), 1);
  EXPECT_TRUE(selects(pdb->node["spec"]["selector"]["matchLabels"], labels));

  // serve --db URL --db-password-file FILE: the URL from the ConfigMap, without a password; the password a file
  // of the Secret quotad-db, never a literal in the args or the environment
  const auto args = strings(c["args"]);
  ASSERT_FALSE(args.empty());
  EXPECT_EQ(args[0], "serve");
  std::map<std::string, std::string> flags;
  for (size_t i = 1; i + 1 < args.size(); i += 2) flags[args[i]] = args[i + 1];
  ASSERT_EQ(flags["--db"], "$(QUOTAD_DB_URL)");
  const YAML::Node url_ref = dig(env_var(c, "QUOTAD_DB_URL"), {"valueFrom", "configMapKeyRef"});
  const Object* db = find_object("ConfigMap", "yolo8-system", url_ref["name"].as<std::string>(""), true);
  ASSERT_NE(db, nullptr);
  const std::string url = db->node["data"][url_ref["key"].as<std::string>("")].as<std::string>("");
  EXPECT_EQ(url.rfind("postgresql://", 0), 0u) << url;
  const std::string authority = url.substr(13, url.find('/', 13) - 13);
  EXPECT_NE(authority.find('@'), std::string::npos) << url;
  EXPECT_EQ(authority.substr(0, authority.find('@')).find(':'), std::string::npos) << "a password in " << url;
  EXPECT_NE(authority.find(":5432"), std::string::npos) << url;
  std::map<std::string, std::string> mount_of_volume;
  for (const auto& m : c["volumeMounts"]) {
    mount_of_volume[m["name"].as<std::string>()] = m["mountPath"].as<std::string>();
  }
  std::string password_file;
  for (const auto& vol : pod["volumes"]) {
    EXPECT_FALSE(vol["persistentVolumeClaim"].IsDefined()) << "the state lives in PostgreSQL";
    if (dig(vol, {"secret", "secretName"}).as<std::string>("") != "quotad-db") continue;
    const YAML::Node item = vol["secret"]["items"][0];
    password_file = mount_of_volume[vol["name"].as<std::string>()] + "/" + item["path"].as<std::string>("password");
  }
  EXPECT_EQ(flags["--db-password-file"], password_file);
  EXPECT_EQ(password_file, "/var/run/secrets/quotad-db/password");
  for (const auto& e : c["env"]) {
    EXPECT_FALSE(dig(e, {"valueFrom", "secretKeyRef"}).IsDefined()) << e["name"] << ": secrets come as files";
  }
  EXPECT_EQ(find_object("Secret", "yolo8-system", "quotad-db", true), nullptr) << "no password in the repository";
  for (const auto& o : objects()) {
    if (o.ha()) EXPECT_NE(o.kind(), "PersistentVolumeClaim") << o.file;
  }

  // the policy and the tokens as the single replica has them; hardened the same way
  const YAML::Node single_pod = single->node["spec"]["template"]["spec"];
  const YAML::Node single_c = container(single_pod, "quotad");
  EXPECT_EQ(flags["--policy"], strings(single_c["args"])[2]);
  EXPECT_EQ(YAML::Dump(env_var(c, "QUOTAD_TOKENS_FILE")), YAML::Dump(env_var(single_c, "QUOTAD_TOKENS_FILE")));
  EXPECT_EQ(YAML::Dump(pod["securityContext"]), YAML::Dump(single_pod["securityContext"]));
  EXPECT_EQ(YAML::Dump(c["securityContext"]), YAML::Dump(single_c["securityContext"]));
  EXPECT_TRUE(c["securityContext"]["readOnlyRootFilesystem"].as<bool>(false));
  EXPECT_EQ(pod["securityContext"]["runAsUser"].as<int>(0), 10001);
  for (const char* kind : {"requests", "limits"}) {
    EXPECT_GT(quantity(c["resources"][kind]["memory"]), 0) << kind;
    EXPECT_GT(quantity(c["resources"][kind]["cpu"]), 0) << kind;
  }
}

TEST(DeployManifests, IndexedJobDerivesRanksFromTheCompletionIndex) {
  const Object* job = nullptr;
  for (const auto& o : objects()) {
    if (o.kind() == "Job" && o.node["spec"]["completionMode"].IsDefined()) job = &o;
  }
  ASSERT_NE(job, nullptr);
  const YAML::Node spec = job->node["spec"];
  EXPECT_EQ(spec["completionMode"].as<std::string>(""), "Indexed");
  const int completions = spec["completions"].as<int>(0);
  EXPECT_GE(completions, 2);
  EXPECT_EQ(spec["parallelism"].as<int>(0), completions) << "every rank must run at once";
  const YAML::Node pod = spec["template"]["spec"];
  const YAML::Node trainer = container(pod, "trainer");
  EXPECT_EQ(dig(env_var(trainer, "RANK"), {"valueFrom", "fieldRef", "fieldPath"}).as<std::string>(""),
            "metadata.annotations['batch.kubernetes.io/job-completion-index']");
  EXPECT_EQ(dig(env_var(trainer, "WORLD_SIZE"), {"value"}).as<int>(0), completions);

  // Rank 0 answers at <job>-0.<subdomain>, a headless Service selecting the pods.
  const std::string subdomain = pod["subdomain"].as<std::string>("");
  const Object* svc = find_object("Service", job->ns(), subdomain);
  ASSERT_NE(svc, nullptr) << "headless Service " << subdomain << " missing";
  EXPECT_EQ(svc->node["spec"]["clusterIP"].as<std::string>(""), "None");
  EXPECT_TRUE(selects(svc->node["spec"]["selector"], spec["template"]["metadata"]["labels"]));
  EXPECT_EQ(dig(env_var(trainer, "MASTER_ADDR"), {"value"}).as<std::string>(""), job->name() + "-0." + subdomain);
  const int port = dig(env_var(trainer, "MASTER_PORT"), {"value"}).as<int>(0);
  EXPECT_EQ(svc->node["spec"]["ports"][0]["port"].as<int>(0), port);
  EXPECT_EQ(trainer["ports"][0]["containerPort"].as<int>(0), port);
  // Every rank reads the checkpoint rank 0 wrote.
  const Object* runs = find_object("PersistentVolumeClaim", job->ns(), "yolo8-runs");
  ASSERT_NE(runs, nullptr);
  EXPECT_EQ(strings(runs->node["spec"]["accessModes"]), std::vector<std::string>{"ReadWriteMany"});
}

TEST(DeployManifests, PriorityClassesFollowThePolicyPriorities) {
  std::map<std::string, int> value;
  for (const auto& pc : of_kind("PriorityClass")) value[pc.name()] = pc.node["value"].as<int>();
  ASSERT_EQ(value.size(), 4u);
  EXPECT_LT(value.at("yolo8-low"), value.at("yolo8-normal"));
  EXPECT_LT(value.at("yolo8-normal"), value.at("yolo8-high"));
  EXPECT_LT(value.at("yolo8-high"), value.at("yolo8-critical"));
  EXPECT_LT(value.at("yolo8-critical"), 1000000000) << "values above 1e9 are reserved for the system";
}

// Namespace limits = the policy's burst; LimitRange defaults = the policy's defaults.
TEST(DeployManifests, TeamQuotasMatchThePolicy) {
  const YAML::Node pol = policy();
  ASSERT_EQ(pol["teams"].size(), 2u);
  for (const auto& kv : pol["teams"]) {
    const std::string team = kv.first.as<std::string>();
    SCOPED_TRACE(team);
    const double base = kv.second["base"].as<double>();
    const double burst = kv.second["burst"].as<double>(base);
    EXPECT_GE(burst, base);
    ASSERT_NE(find_object("Namespace", "", team), nullptr);
    const auto quotas = of_kind("ResourceQuota");
    const auto rq = std::find_if(quotas.begin(), quotas.end(), [&](const Object& o) { return o.ns() == team; });
    ASSERT_NE(rq, quotas.end());
    const YAML::Node hard = rq->node["spec"]["hard"];
    EXPECT_EQ(quantity(hard["requests.nvidia.com/gpu"]), burst);
    EXPECT_GT(quantity(hard["requests.memory"]), 0);
    const auto ranges = of_kind("LimitRange");
    const auto lr = std::find_if(ranges.begin(), ranges.end(), [&](const Object& o) { return o.ns() == team; });
    ASSERT_NE(lr, ranges.end());
    const YAML::Node limits = lr->node["spec"]["limits"][0];
    EXPECT_EQ(limits["type"].as<std::string>(""), "Container");
    EXPECT_EQ(quantity(limits["default"]["nvidia.com/gpu"]), pol["defaults"]["gpus"].as<double>(1));
    EXPECT_EQ(quantity(limits["defaultRequest"]["nvidia.com/gpu"]), pol["defaults"]["gpus"].as<double>(1));
    EXPECT_GT(quantity(limits["default"]["memory"]), 0);
    EXPECT_LE(quantity(limits["defaultRequest"]["memory"]), quantity(limits["default"]["memory"]));
    EXPECT_LE(quantity(limits["max"]["nvidia.com/gpu"]), burst);
  }
}

TEST(DeployManifests, KueueQueuesMirrorBaseAndBurst) {
  const YAML::Node pol = policy();
  std::set<std::string> flavors;
  for (const auto& f : of_kind("ResourceFlavor")) flavors.insert(f.name());
  std::map<std::string, const Object*> queues;
  const std::vector<Object> cqs = of_kind("ClusterQueue");
  for (const auto& q : cqs) queues[q.name()] = &q;

  double cohort_gpus = 0;
  std::set<std::string> cohorts;
  auto gpu_quota = [&](const Object& q, const char* field) {
    double sum = 0;
    for (const auto& group : q.node["spec"]["resourceGroups"]) {
      for (const auto& flavor : group["flavors"]) {
        EXPECT_EQ(flavors.count(flavor["name"].as<std::string>("")), 1u) << "unknown flavour in " << q.name();
        for (const auto& res : flavor["resources"]) {
          if (res["name"].as<std::string>("") == "nvidia.com/gpu" && res[field].IsDefined()) {
            sum += quantity(res[field]);
          }
        }
      }
    }
    return sum;
  };
  for (const auto& q : cqs) {
    cohorts.insert(q.node["spec"]["cohort"].as<std::string>(""));
    cohort_gpus += gpu_quota(q, "nominalQuota");
  }
  EXPECT_EQ(cohorts.size(), 1u) << "one cohort, so teams can borrow";
  EXPECT_EQ(cohort_gpus, inventory_gpus(pol)) << "the cohort's nominal quotas must add up to the inventory";

  for (const auto& kv : pol["teams"]) {
    const std::string team = kv.first.as<std::string>();
    SCOPED_TRACE(team);
    ASSERT_EQ(queues.count(team), 1u) << "no ClusterQueue for the team";
    const Object& q = *queues[team];
    const double base = kv.second["base"].as<double>();
    const double burst = kv.second["burst"].as<double>(base);
    EXPECT_EQ(gpu_quota(q, "nominalQuota"), base);
    EXPECT_EQ(gpu_quota(q, "borrowingLimit"), burst - base);
    EXPECT_EQ(dig(q.node, {"spec", "namespaceSelector", "matchLabels", "yolo8.io/team"}).as<std::string>(""), team);
    const Object* ns = find_object("Namespace", "", team);
    ASSERT_NE(ns, nullptr);
    EXPECT_EQ(dig(ns->node, {"metadata", "labels", "yolo8.io/team"}).as<std::string>(""), team);
  }
  const Object* emergency = queues.count("yolo8-emergency") ? queues["yolo8-emergency"] : nullptr;
  ASSERT_NE(emergency, nullptr);
  EXPECT_EQ(gpu_quota(*emergency, "nominalQuota"),
            std::ceil(pol["emergency_pool"].as<double>() * inventory_gpus(pol) - 1e-9));

  // LocalQueues point at existing ClusterQueues; the Kueue Job at an existing LocalQueue, suspended.
  for (const auto& lq : of_kind("LocalQueue")) {
    EXPECT_EQ(queues.count(lq.node["spec"]["clusterQueue"].as<std::string>("")), 1u) << lq.name();
    EXPECT_NE(find_object("Namespace", "", lq.ns()), nullptr) << lq.name();
  }
  int kueue_jobs = 0;
  for (const auto& job : of_kind("Job")) {
    const std::string queue = dig(job.node, {"metadata", "labels", "kueue.x-k8s.io/queue-name"}).as<std::string>("");
    if (queue.empty()) continue;
    ++kueue_jobs;
    const Object* lq = find_object("LocalQueue", job.ns(), queue);
    ASSERT_NE(lq, nullptr) << job.name();
    EXPECT_TRUE(job.node["spec"]["suspend"].as<bool>(false)) << job.name();
    // Kueue leaves a workload pending forever if its ClusterQueue does not cover a resource it requests.
    const Object* cq = queues[lq->node["spec"]["clusterQueue"].as<std::string>()];
    const auto covered = strings(cq->node["spec"]["resourceGroups"][0]["coveredResources"]);
    for (const auto& c : job.node["spec"]["template"]["spec"]["containers"]) {
      for (const char* kind : {"requests", "limits"}) {
        for (const auto& res : dig(c, {"resources", kind})) {
          EXPECT_TRUE(contains(covered, res.first.as<std::string>())) << res.first << " not covered by " << cq->name();
        }
      }
    }
  }
  EXPECT_EQ(kueue_jobs, 1);
}

// Host memory per GPU is the same in the namespace quotas and the Kueue queues; CPU per GPU the same
// in every queue; every covered resource has a quota.
TEST(DeployManifests, ResourcesPerGpuAgreeBetweenQuotasAndQueues) {
  std::map<std::string, std::set<double>> per_gpu;
  for (const auto& rq : of_kind("ResourceQuota")) {
    const YAML::Node hard = rq.node["spec"]["hard"];
    per_gpu["memory"].insert(quantity(hard["requests.memory"]) / quantity(hard["requests.nvidia.com/gpu"]));
    EXPECT_EQ(quantity(hard["requests.memory"]), quantity(hard["limits.memory"])) << rq.ns();
  }
  for (const auto& q : of_kind("ClusterQueue")) {
    SCOPED_TRACE(q.name());
    const YAML::Node group = q.node["spec"]["resourceGroups"][0];
    const auto covered = strings(group["coveredResources"]);
    ASSERT_TRUE(contains(covered, "nvidia.com/gpu"));
    const YAML::Node resources = group["flavors"][0]["resources"];
    ASSERT_EQ(resources.size(), covered.size());
    for (const char* field : {"nominalQuota", "borrowingLimit"}) {
      std::map<std::string, double> amount;
      for (size_t i = 0; i < resources.size(); ++i) {
        EXPECT_EQ(resources[i]["name"].as<std::string>(), covered[i]) << "resources out of coveredResources order";
        if (resources[i][field].IsDefined()) amount[covered[i]] = quantity(resources[i][field]);
      }
      if (amount["nvidia.com/gpu"] == 0) continue;
      for (const auto& [name, value] : amount) {
        if (name != "nvidia.com/gpu") per_gpu[name].insert(value / amount["nvidia.com/gpu"]);
      }
    }
  }
  EXPECT_EQ(per_gpu["memory"].size(), 1u);
  EXPECT_LE(per_gpu["cpu"].size(), 1u);
}

// The cluster and quotad must never disagree: the teams in the ConfigMap match configs/quota-policy.yaml.
TEST(DeployManifests, PolicyConfigMapMatchesTheRepositoryPolicy) {
  const fs::path repo_policy = fs::path(test::kSourceDir) / "configs" / "quota-policy.yaml";
  ASSERT_TRUE(fs::exists(repo_policy)) << repo_policy;
  const YAML::Node repo = YAML::LoadFile(repo_policy.string());
  const YAML::Node deployed = policy();
  int compared = 0;
  for (const auto& kv : deployed["teams"]) {
    const std::string team = kv.first.as<std::string>();
    const YAML::Node other = repo["teams"][team];
    if (!other.IsDefined()) continue;
    ++compared;
    EXPECT_EQ(other["base"].as<double>(), kv.second["base"].as<double>()) << team;
    EXPECT_EQ(other["burst"].as<double>(other["base"].as<double>()), kv.second["burst"].as<double>()) << team;
  }
  EXPECT_GE(compared, 1) << "no team of deploy/ is in " << repo_policy;
}

// One Dockerfile instruction, continuation lines joined, comments dropped.
struct Instruction {
  std::string keyword;  // upper case
  std::string rest;
};

std::vector<Instruction> dockerfile() {
  std::istringstream in(read_text(deploy_dir() / "docker" / "Dockerfile"));
  std::vector<Instruction> out;
  std::string line, pending;
  while (std::getline(in, line)) {
    const auto first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    const bool continued = line.back() == '\\';
    pending += continued ? line.substr(0, line.size() - 1) : line;
    if (continued) continue;
    std::istringstream words(pending);
    Instruction ins;
    words >> ins.keyword;
    std::getline(words, ins.rest);
    std::transform(ins.keyword.begin(), ins.keyword.end(), ins.keyword.begin(), ::toupper);
    out.push_back(ins);
    pending.clear();
  }
  return out;
}

TEST(DeployDockerfile, MultiStageFromOneBaseArgumentWithNonRootTiniStages) {
  const auto instructions = dockerfile();
  ASSERT_FALSE(instructions.empty());
  // Stages by name, with the instructions each holds.
  std::map<std::string, std::vector<Instruction>> stages;
  std::vector<std::string> order;
  bool base_arg_before_from = false;
  for (const auto& ins : instructions) {
    if (ins.keyword == "FROM") {
      const auto as = ins.rest.find(" AS ");
      ASSERT_NE(as, std::string::npos) << "unnamed stage: FROM" << ins.rest;
      order.push_back(ins.rest.substr(as + 4));
      stages[order.back()] = {};
      stages[order.back()].push_back(ins);
    } else if (order.empty()) {
      if (ins.keyword == "ARG" && ins.rest.find("BASE_IMAGE=debian:bookworm") != std::string::npos) {
        base_arg_before_from = true;
      }
    } else {
      stages[order.back()].push_back(ins);
    }
  }
  EXPECT_TRUE(base_arg_before_from) << "ARG BASE_IMAGE=debian:bookworm must come before the first FROM";
  ASSERT_EQ(stages.count("base"), 1u);
  EXPECT_NE(stages["base"][0].rest.find("${BASE_IMAGE}"), std::string::npos) << "the base ignores BASE_IMAGE";
  for (const std::string stage : {"torch-runtime", "runtime-base"}) {
    ASSERT_EQ(stages.count(stage), 1u) << stage;
    EXPECT_EQ(stages[stage][0].rest.rfind(" base AS ", 0), 0u) << stage << ": FROM" << stages[stage][0].rest;
  }
  EXPECT_EQ(order.back(), "yolo8") << "the default target is the trainer";

  for (const std::string target : {"yolo8", "quotad"}) {
    SCOPED_TRACE(target);
    ASSERT_EQ(stages.count(target), 1u);
    EXPECT_EQ(stages[target][0].rest.rfind(" runtime-base AS ", 0), 0u) << "FROM" << stages[target][0].rest;
    std::string user, entrypoint;
    bool copies_binary = false;
    bool copies_torch = false;
    for (const auto& ins : stages[target]) {
      if (ins.keyword == "USER") user = ins.rest;
      if (ins.keyword == "ENTRYPOINT") entrypoint = ins.rest;
      if (ins.keyword == "COPY" && ins.rest.find("bin/" + target + " /usr/local/bin/" + target) != std::string::npos) {
        copies_binary = true;
      }
      if (ins.keyword == "COPY" && ins.rest.find("--from=torch-runtime") != std::string::npos) copies_torch = true;
      if (ins.keyword == "RUN") {
        EXPECT_EQ(ins.rest.find("-dev "), std::string::npos) << "no -dev packages at run time";
        for (const char* tool : {" g++", " cmake", " python3", " pip"}) {
          EXPECT_EQ(ins.rest.find(tool), std::string::npos) << tool << " in a runtime stage";
        }
      }
    }
    user.erase(0, user.find_first_not_of(' '));
    EXPECT_EQ(user, "10001:10001");
    EXPECT_NE(entrypoint.find("\"/usr/bin/tini\", \"-g\", \"--\", \"/usr/local/bin/" + target + "\""),
              std::string::npos)
        << entrypoint;
    EXPECT_TRUE(copies_binary) << "the runtime stage must take bin/" << target << " from the context";
    EXPECT_EQ(copies_torch, target == "yolo8") << "LibTorch goes into the trainer's image only";
  }
}

}  // namespace
}  // namespace yolo8
