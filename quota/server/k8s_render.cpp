#include "quota/server/k8s_render.h"

#include <yaml-cpp/yaml.h>

#include <cmath>
#include <stdexcept>

namespace yolo8::quota {
namespace {

std::string quantity_gib(double gib) { return std::to_string(static_cast<long long>(std::llround(gib))) + "Gi"; }

std::string whole(double value) { return std::to_string(static_cast<long long>(std::llround(value))); }

// Kubernetes' DNS-1123 label (apimachinery IsDNS1123Label): what a Namespace name must be.
bool dns1123_label(const std::string& name) {
  if (name.empty() || name.size() > 63) return false;
  auto alnum = [](char character) {
    return (character >= 'a' && character <= 'z') || (character >= '0' && character <= '9');
  };
  for (char character : name) {
    if (!alnum(character) && character != '-') return false;
  }
  return alnum(name.front()) && alnum(name.back());
}

void metadata(YAML::Emitter& out, const std::string& name, const std::string& ns) {
  out << YAML::Key << "metadata" << YAML::Value << YAML::BeginMap << YAML::Key << "name" << YAML::Value << name;
  if (!ns.empty()) out << YAML::Key << "namespace" << YAML::Value << ns;
}

// Quantities as strings ("8"), as kubectl writes them: a bare 8 is an int to YAML, a string to the API.
void quantity(YAML::Emitter& out, const std::string& key, const std::string& value) {
  out << YAML::Key << key << YAML::Value << YAML::DoubleQuoted << value;
}

}  // namespace

void check_k8s_names(const Policy& policy) {
  for (const auto& [name, team] : policy.teams) {
    if (!dns1123_label(name)) {
      throw std::invalid_argument("render-k8s: team '" + name +
                                  "': its Namespace name must be a DNS-1123 label (lower-case letters, digits and "
                                  "'-', starting and ending with a letter or digit, at most 63 characters)");
    }
  }
}

std::string render_k8s(const Policy& policy, const K8sRenderOptions& options) {
  check_k8s_names(policy);  // before anything is written
  YAML::Emitter out;
  out.SetIndent(2);
  out.SetSeqFormat(YAML::Block);
  out << YAML::Comment("Rendered by `quotad render-k8s` from the quota policy: do not edit, render again.");
  const int default_gpus = std::max(1, policy.default_gpus);
  for (const auto& [name, team] : policy.teams) {  // std::map: name order, deterministic
    const double burst = std::max(team.burst, team.base);
    const double host_memory = burst * options.host_memory_gib_per_gpu;

    out << YAML::BeginDoc << YAML::BeginMap;
    out << YAML::Key << "apiVersion" << YAML::Value << "v1" << YAML::Key << "kind" << YAML::Value << "Namespace";
    metadata(out, name, "");
    out << YAML::Key << "labels" << YAML::Value << YAML::BeginMap << YAML::Key << "yolo8.io/team" << YAML::Value << name
        << YAML::EndMap << YAML::EndMap << YAML::EndMap;

    out << YAML::BeginDoc << YAML::BeginMap
        << YAML::Comment("Burst limit " + whole(burst) + " GPUs (base " + whole(team.base) +
                         " is quotad's guarantee; the ResourceQuota caps the namespace at the burst).");
    out << YAML::Key << "apiVersion" << YAML::Value << "v1" << YAML::Key << "kind" << YAML::Value << "ResourceQuota";
    metadata(out, "gpu-quota", name);
    out << YAML::EndMap << YAML::Key << "spec" << YAML::Value << YAML::BeginMap << YAML::Key << "hard" << YAML::Value
        << YAML::BeginMap;
    quantity(out, "requests.nvidia.com/gpu", whole(burst));
    quantity(out, "requests.memory", quantity_gib(host_memory));
    quantity(out, "limits.memory", quantity_gib(host_memory));
    out << YAML::EndMap << YAML::EndMap << YAML::EndMap;

    out << YAML::BeginDoc << YAML::BeginMap
        << YAML::Comment("Defaults for containers that declare nothing: the policy's default GPU count.");
    out << YAML::Key << "apiVersion" << YAML::Value << "v1" << YAML::Key << "kind" << YAML::Value << "LimitRange";
    metadata(out, "gpu-defaults", name);
    out << YAML::EndMap << YAML::Key << "spec" << YAML::Value << YAML::BeginMap << YAML::Key << "limits" << YAML::Value
        << YAML::BeginSeq << YAML::BeginMap << YAML::Key << "type" << YAML::Value << "Container";
    out << YAML::Key << "default" << YAML::Value << YAML::BeginMap;
    quantity(out, "nvidia.com/gpu", std::to_string(default_gpus));
    quantity(out, "memory", quantity_gib(default_gpus * options.host_memory_gib_per_gpu));
    out << YAML::EndMap << YAML::Key << "defaultRequest" << YAML::Value << YAML::BeginMap;
    quantity(out, "nvidia.com/gpu", std::to_string(default_gpus));
    quantity(out, "memory", quantity_gib(default_gpus * options.host_memory_gib_per_gpu / 2));
    quantity(out, "cpu", std::to_string(default_gpus * options.cpus_per_gpu));
    out << YAML::EndMap << YAML::Key << "max" << YAML::Value << YAML::BeginMap;
    quantity(out, "nvidia.com/gpu", whole(burst));
    out << YAML::EndMap << YAML::EndMap << YAML::EndSeq << YAML::EndMap << YAML::EndMap;
  }
  if (!out.good()) throw std::logic_error("render-k8s: YAML emitter: " + out.GetLastError());
  return std::string(out.c_str()) + "\n";
}

}  // namespace yolo8::quota
