#pragma once
// Kubernetes objects derived from the quota policy, so the cluster and quotad never disagree:
// per team a Namespace, a ResourceQuota at the team's burst limit and a LimitRange with the policy's defaults.

#include <string>

#include "quota/core/policy.h"

namespace yolo8::quota {

struct K8sRenderOptions {
  double host_memory_gib_per_gpu = 32;  // container memory a GPU comes with (ResourceQuota, LimitRange)
  int cpus_per_gpu = 4;
};

// Multi-document YAML written by yaml-cpp's emitter, teams in name order; the same policy always gives the same
// bytes. Throws std::invalid_argument (naming the team and the rule) before emitting anything when a name would
// not be a valid Kubernetes name.
std::string render_k8s(const Policy& policy, const K8sRenderOptions& options = {});

// Throws std::invalid_argument naming the first team whose name is not a DNS-1123 label (its Namespace's name).
void check_k8s_names(const Policy& policy);

}  // namespace yolo8::quota
