#include "trainer/app/lease.h"

#include <unistd.h>

#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <set>
#include <sstream>

#include "quota/core/policy.h"
#include "trainer/app/utilisation.h"
#include "trainer/core/stop_signal.h"

namespace yolo8 {

std::vector<std::string> visible_gpu_uuids() {
  for (const char* name : {"NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES"}) {
    const char* value = std::getenv(name);
    if (value == nullptr || *value == '\0') continue;
    std::vector<std::string> uuids;
    std::string item;
    std::istringstream list(value);
    while (std::getline(list, item, ',')) {
      if (item.rfind("GPU-", 0) == 0 || item.rfind("MIG-", 0) == 0) uuids.push_back(item);
    }
    if (!uuids.empty()) return uuids;
  }
  return {};
}

std::string device_conflict(const std::vector<std::string>& lease_devices, const std::vector<int>& device_ids,
                            const std::string& node, bool remapped) {
  if (device_ids.empty() || lease_devices.empty()) return "";
  std::string leased;
  std::set<int> indices;
  std::set<std::string> nodes;
  for (const auto& device : lease_devices) {
    leased += (leased.empty() ? "" : ", ") + device;
    const auto colon = device.rfind(':');
    nodes.insert(device.substr(0, colon));
    if (colon != std::string::npos) indices.insert(std::atoi(device.c_str() + colon + 1));
  }
  std::string asked;
  for (int id : device_ids) asked += (asked.empty() ? "" : ",") + std::to_string(id);
  const std::string head = "setting 'device' (" + asked + ") contradicts the lease, which holds " + leased + ": ";
  if (remapped) {
    // the device plugin numbered the leased GPUs 0..n-1 inside the container
    for (int id : device_ids) {
      if (id >= static_cast<int>(lease_devices.size())) {
        return head + "GPU " + std::to_string(id) + " is outside the " + std::to_string(lease_devices.size()) +
               " GPU(s) made visible";
      }
    }
    return "";
  }
  if (!node.empty() && !nodes.count(node)) {
    return head + "this trainer runs on " + node + "; run it on the leased node";
  }
  if (std::set<int>(device_ids.begin(), device_ids.end()) != indices) {
    std::string use;
    for (int index : indices) use += (use.empty() ? "" : ",") + std::to_string(index);
    return head + "use device=" + use;
  }
  return "";
}

TrainingLease::TrainingLease(const Settings& settings, const std::string& job_name, bool uses_gpu, int gpus,
                             double gpu_memory_gib, const std::string& device_name) {
  if (settings.lease.quota == "off") return;
  // Leases are for GPUs; a CPU run has nothing to share, unless it asks for a share explicitly (its budget is
  // then the share, enforced by the counting allocator).
  if (settings.lease.quota == "local" && !uses_gpu && !settings.lease.shared) return;
  // The client's own reading of the setting (mode, $YOLO8_QUOTA_TOKEN); explicit settings win over it.
  quota::ClientConfig config =
      quota::client_config_from_setting(settings.lease.quota, std::max(1, gpus), gpu_memory_gib);
  if (!settings.lease.quota_token.empty()) config.token = settings.lease.quota_token;
  if (!settings.lease.quota_db.empty()) config.local_db = settings.lease.quota_db;
  if (!settings.lease.user.empty()) config.user = settings.lease.user;
  client_ = std::make_unique<quota::QuotaClient>(config);

  quota::LeaseRequest request;
  // The local quota's policy has one team, its user's: the service fills it in (the `team` setting is for quotad).
  request.team = config.mode == "local" ? std::string() : settings.lease.team;
  request.user =
      settings.lease.user.empty() ? (std::getenv("USER") ? std::getenv("USER") : "unknown") : settings.lease.user;
  request.job = job_name;
  request.model = std::filesystem::path(settings.model).stem().string();
  request.imgsz = settings.loader.imgsz;
  request.batch = settings.batch >= 1 ? static_cast<int>(settings.batch) : 0;
  request.gpus = std::max(1, gpus);
  request.shared = settings.lease.shared;
  request.visible_devices = visible_gpu_uuids();
  const char* node_name = std::getenv("NODE_NAME");  // Kubernetes' downward API (spec.nodeName)
  const std::string node = config.mode == "local" ? std::string() : (node_name ? node_name : "");
  request.node = node;
  request.memory_gib = settings.lease.memory_gib;
  request.priority = quota::parse_priority(settings.lease.priority);
  request.preemptible = settings.lease.preemptible;
  request.justification = settings.lease.justification;
  request.idempotency_key = job_name + "-" + std::to_string(getpid()) + "-" +
                            std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
  std::cout << "Asking " << (settings.lease.quota == "local" ? std::string("the local quota") : settings.lease.quota)
            << " for a lease: team " << (request.team.empty() ? "local" : request.team) << ", " << request.model << ", "
            << request.gpus << " GPU, priority " << settings.lease.priority << "\n";
  const quota::LeaseInfo lease = client_->acquire(request, [](const quota::WaitInfo& wait) {
    // SIGTERM while queued: nothing to checkpoint yet; give up the place and exit as preempted.
    if (stop_requested()) throw StoppedWhileWaiting();
    std::cout << "  waiting (" << wait.status << ", position " << wait.position << "): " << wait.reason << std::endl;
  });
  std::string devices;
  for (const auto& device : lease.devices) devices += (devices.empty() ? "" : ",") + device;
  std::cout << "Lease " << lease.id << " granted: " << (lease.shared ? "a share of " : "") << lease.devices.size()
            << " GPU (" << devices << "), " << lease.memory_gib << " GiB each, heartbeat every "
            << lease.heartbeat_interval_s << " s\n";
  if (!lease.memory_row.empty()) std::cout << "  admission used the " << lease.memory_row << "\n";
  // The trainer uses exactly the leased GPUs: a device= that says otherwise is a mistake to fix, not to run with.
  // Not in local mode: its inventory is a count of slots sized to the request (local:0..n-1), not the
  // machine's GPU numbers, so device=1 legitimately holds local:0 there.
  const bool bound = uses_gpu && config.mode != "local";
  const std::string conflict =
      bound ? device_conflict(lease.devices, settings.device_ids(), node, !request.visible_devices.empty()) : "";
  if (!conflict.empty()) {
    client_->release(quota::Outcome::kCancelled);
    released_ = true;
    throw SettingsError(conflict);
  }
  // Utilisation from the leased devices (NVML) when the run uses a GPU and the driver's library loads; the busy
  // share of each heartbeat interval otherwise. Sampled on the heartbeat thread, once per interval.
  std::unique_ptr<Nvml> nvml;
  std::vector<std::string> nvml_devices;
  if (uses_gpu) {
    std::string why;
    nvml = Nvml::load(kNvmlLibrary, &why);
    std::vector<int> cuda_ids = settings.device_ids();
    if (cuda_ids.empty()) cuda_ids = {0};
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    nvml_devices = nvml_device_names(cuda_ids, visible ? visible : "");
    if (!nvml) std::cout << "Utilisation: NVML unavailable (" << why << "); reporting the busy share of the time\n";
  }
  auto sampler = std::make_shared<UtilisationSampler>(std::move(nvml), std::move(nvml_devices), monotonic_seconds());
  // what the memory peak was measured with (quotad memory-table --observed learns from it)
  quota::Telemetry context;
  context.model = request.model;
  context.imgsz = request.imgsz;
  context.amp = settings.amp && uses_gpu ? 1 : 0;  // AMP is CUDA-only here
  context.device_name = device_name;
  context.libtorch = TORCH_VERSION;  // learned tables are per LibTorch version (its kernels and allocator)
  const double interval_s = std::max(1, lease.heartbeat_interval_s);  // as the client paces them
  client_->start_heartbeats([this, sampler, context, interval_s] {
    quota::Telemetry telemetry = context;
    telemetry.batch = telemetry_.batch.load();
    telemetry.step = telemetry_.step.load();
    telemetry.epoch = telemetry_.epoch.load();
    telemetry.memory_used_gib = telemetry_.memory_used_gib.load();
    // one process, or rank 0 of a data-parallel job speaking for every rank's device (with_other_ranks)
    const double now = monotonic_seconds();
    const UtilisationSampler::Reading reading =
        with_other_ranks(sampler->sample(telemetry_.busy_seconds.load(), now), telemetry_.ranks(), now, interval_s);
    telemetry.gpu_util = reading.util;
    telemetry.gpu_util_source = reading.source;
    telemetry.device_memory_used_gib = reading.device_memory_used_gib;
    telemetry.last_checkpoint_ms = telemetry_.last_checkpoint_ms.load();
    return telemetry;
  });
}

TrainingLease::~TrainingLease() {
  if (client_ && !released_) {
    try {
      client_->release(quota::Outcome::kFailed);
    } catch (const std::exception& error) {
      std::cerr << "yolo8: could not release the lease: " << error.what() << "\n";
    }
  }
}

double TrainingLease::memory_gib() const { return client_ ? client_->lease().memory_gib : 0.0; }

int64_t TrainingLease::id() const { return client_ ? client_->lease().id : 0; }

void TrainingLease::check() {
  if (!client_) return;
  if (client_->revoked() || client_->lost()) request_stop(StopReason::kLeaseRevoked);
  if (client_->unreachable_too_long()) request_stop(StopReason::kQuotaUnreachable);
}

void TrainingLease::release(quota::Outcome outcome) {
  if (!client_ || released_) return;
  released_ = true;
  client_->release(outcome);
  std::cout << "Lease " << client_->lease().id << " released (" << quota::to_string(outcome) << ")\n";
}

}  // namespace yolo8
