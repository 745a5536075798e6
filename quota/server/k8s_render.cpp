#include "quota/server/k8s_render.h"

#include <cmath>
#include <sstream>

namespace yolo8::quota {
namespace {

std::string quantity_gib(double gib) {
  std::ostringstream out;
  out << static_cast<long long>(std::llround(gib)) << "Gi";
  return out.str();
}

std::string whole(double value) { return std::to_string(static_cast<long long>(std::llround(value))); }

}  // namespace

std::string render_k8s(const Policy& policy, const K8sRenderOptions& options) {
  std::ostringstream out;
  out << "# Rendered by `quotad render-k8s` from the quota policy: do not edit, render again.\n";
  bool first = true;
  for (const auto& [name, team] : policy.teams) {  // std::map: name order, deterministic
    const double burst = std::max(team.burst, team.base);
    const int default_gpus = std::max(1, policy.default_gpus);
    if (!first) out << "---\n";
    first = false;
    out << "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: " << name << "\n  labels:\n    yolo8.io/team: " << name
        << "\n";
    out << "---\n# Burst limit " << whole(burst) << " GPUs (base " << whole(team.base)
        << " is quotad's guarantee; the ResourceQuota caps the namespace at the burst).\n";
    out << "apiVersion: v1\nkind: ResourceQuota\nmetadata:\n  name: gpu-quota\n  namespace: " << name
        << "\nspec:\n  hard:\n    requests.nvidia.com/gpu: \"" << whole(burst)
        << "\"\n    requests.memory: " << quantity_gib(burst * options.host_memory_gib_per_gpu)
        << "\n    limits.memory: " << quantity_gib(burst * options.host_memory_gib_per_gpu) << "\n";
    out << "---\n# Defaults for containers that declare nothing: the policy's default GPU count.\n";
    out << "apiVersion: v1\nkind: LimitRange\nmetadata:\n  name: gpu-defaults\n  namespace: " << name
        << "\nspec:\n  limits:\n    - type: Container\n      default:\n        nvidia.com/gpu: \"" << default_gpus
        << "\"\n        memory: " << quantity_gib(default_gpus * options.host_memory_gib_per_gpu)
        << "\n      defaultRequest:\n        nvidia.com/gpu: \"" << default_gpus
        << "\"\n        memory: " << quantity_gib(default_gpus * options.host_memory_gib_per_gpu / 2)
        << "\n        cpu: \"" << default_gpus * options.cpus_per_gpu << "\"\n      max:\n        nvidia.com/gpu: \""
        << whole(burst) << "\"\n";
  }
  return out.str();
}

}  // namespace yolo8::quota
