#include "trainer/run/lease.h"

#include <unistd.h>

#include <nlohmann/json.hpp>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>

#include "quota/core/policy.h"
#include "trainer/core/stop_signal.h"
#include "trainer/runtime/utilisation.h"

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

namespace {

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : separator) + item;
  return text;
}

std::string join(const std::vector<int>& items) {
  std::vector<std::string> texts;
  for (int item : items) texts.push_back(std::to_string(item));
  return join(texts, ",");
}

// "2026-12-04 18:40:12 UTC" of wall-clock milliseconds.
std::string utc_time(int64_t ms) {
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm parts{};
  gmtime_r(&seconds, &parts);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%d %H:%M:%S UTC", &parts);
  return text;
}

// CUDA's reading of CUDA_VISIBLE_DEVICES as indices: the devices listed before the first entry that is not one.
std::vector<int> visible_indices(const std::string& list) {
  std::vector<int> indices;
  std::string item;
  std::istringstream stream(list);
  while (std::getline(stream, item, ',')) {
    const auto first = item.find_first_not_of(" \t");
    const auto last = item.find_last_not_of(" \t");
    if (first == std::string::npos) break;
    item = item.substr(first, last - first + 1);
    if (item.size() > 6 || item.find_first_not_of("0123456789") != std::string::npos) break;
    indices.push_back(std::stoi(item));
  }
  return indices;
}

}  // namespace

DeviceBinding bind_leased_devices(const std::vector<std::string>& lease_devices, const std::string& node,
                                  const std::vector<int>& device_ids, const std::string& cuda_visible_devices,
                                  bool remapped) {
  if (lease_devices.empty()) return {};
  const std::string leased = join(lease_devices, ", ");
  const std::string head = "setting 'device' (" + (device_ids.empty() ? std::string("empty") : join(device_ids)) + ") ";
  remapped = remapped || cuda_visible_devices.rfind("GPU-", 0) == 0 || cuda_visible_devices.rfind("MIG-", 0) == 0;
  DeviceBinding binding;
  if (remapped) {
    // the device plugin numbered the leased GPUs 0..n-1 inside the container: only the count can be checked
    const int count = static_cast<int>(lease_devices.size());
    for (int id : device_ids) {
      if (id >= count) {
        throw SettingsError(head + "contradicts the lease, which holds " + leased + ": GPU " + std::to_string(id) +
                            " is outside the " + std::to_string(count) + " GPU(s) made visible");
      }
    }
    binding.ordinals = device_ids.empty() ? std::vector<int>{0} : device_ids;  // one process: the first one
  } else {
    // the leased GPUs on this node, by physical index, in the lease's order
    std::vector<int> physical;
    std::vector<std::string> here;
    for (const auto& device : lease_devices) {
      const auto colon = device.rfind(':');
      if (colon == std::string::npos) continue;
      if (!node.empty() && device.substr(0, colon) != node) continue;
      const int index = std::atoi(device.c_str() + colon + 1);
      if (std::find(physical.begin(), physical.end(), index) == physical.end()) physical.push_back(index);
      here.push_back(device);
    }
    if (physical.empty()) {
      throw SettingsError(head + "cannot use the lease, which holds " + leased + ": this trainer runs on " + node +
                          "; run it on the leased node");
    }
    // CUDA_VISIBLE_DEVICES=1,2 makes physical GPU 2 CUDA device 1
    const std::vector<int> visible = visible_indices(cuda_visible_devices);
    std::vector<int> expected;
    for (size_t i = 0; i < physical.size(); ++i) {
      if (cuda_visible_devices.empty()) {
        expected.push_back(physical[i]);
        continue;
      }
      const auto at = std::find(visible.begin(), visible.end(), physical[i]);
      if (at == visible.end()) {
        throw SettingsError(head + "cannot use the lease, which holds " + leased + ": GPU " + here[i] +
                            " is not visible to this process (CUDA_VISIBLE_DEVICES=" + cuda_visible_devices +
                            "); add " + std::to_string(physical[i]) + " to CUDA_VISIBLE_DEVICES or unset it");
      }
      expected.push_back(static_cast<int>(at - visible.begin()));
    }
    if (!device_ids.empty() &&
        std::set<int>(device_ids.begin(), device_ids.end()) != std::set<int>(expected.begin(), expected.end())) {
      std::string use = "use device=" + join(expected);
      if (!cuda_visible_devices.empty()) use += " (as CUDA_VISIBLE_DEVICES=" + cuda_visible_devices + " numbers them)";
      throw SettingsError(head + "contradicts the lease, which holds " + leased + ": " + use +
                          ", or leave device= empty");
    }
    binding.ordinals = device_ids.empty() ? std::vector<int>{expected.front()} : device_ids;  // one process: the first
  }
  binding.summary = std::string(binding.ordinals.size() == 1 ? "Using GPU " : "Using GPUs ") + join(binding.ordinals) +
                    " (leased " + leased + ")";
  return binding;
}

std::vector<int> node_gpu_indices(const std::vector<int>& device_ids, const std::string& cuda_visible_devices) {
  if (cuda_visible_devices.empty()) return device_ids;
  const std::vector<int> visible = visible_indices(cuda_visible_devices);
  std::vector<int> indices;
  for (int id : device_ids) {
    if (id < 0 || static_cast<size_t>(id) >= visible.size()) return {};
    indices.push_back(visible[static_cast<size_t>(id)]);
  }
  return indices;
}

TrainingLease::TrainingLease(const Settings& settings, const std::string& job_name, bool uses_gpu, int gpus,
                             LocalGpus local_gpus, const std::string& device_name,
                             const std::filesystem::path& unreleased_file)
    : quota_(settings.lease.quota), unreleased_file_(unreleased_file) {
  if (settings.lease.quota == "off") return;
  // Leases are for GPUs; a CPU run has nothing to share, unless it asks for a share explicitly (its budget is
  // then the share, enforced by the counting allocator).
  if (settings.lease.quota == "local" && !uses_gpu && !settings.lease.shared) return;
  // The client's own reading of the setting (mode, $YOLO8_QUOTA_TOKEN); explicit settings win over it.
  // The local quota's inventory is this machine's GPUs (local:i is CUDA ordinal i), so two local trainers get
  // different ones; a CPU run's share holds the one slot there is.
  quota::ClientConfig config = quota::client_config_from_setting(
      settings.lease.quota, uses_gpu ? std::max(1, local_gpus.count) : 1, uses_gpu ? local_gpus.memory_gib : 0.0);
  if (!settings.lease.quota_token.empty()) config.token = settings.lease.quota_token;
  if (!settings.lease.quota_token_file.empty() && config.mode.find("://") != std::string::npos) {
    config.token.clear();  // the file wins over $YOLO8_QUOTA_TOKEN
    config.token_file = settings.lease.quota_token_file;
  }
  if (!settings.lease.quota_db.empty()) config.local_db = settings.lease.quota_db;
  if (!settings.lease.user.empty()) config.user = settings.lease.user;
  config.unavailable_deadline_s = settings.lease.quota_retry_s;
  try {
    client_ = std::make_unique<quota::QuotaClient>(config);
  } catch (const std::invalid_argument& error) {
    throw SettingsError(error.what());  // a token file that cannot be read: "quota_token_file: cannot read '...'"
  }

  release_earlier_lease();

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
  const bool local = config.mode == "local";
  const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
  const std::string node = local ? std::string("local") : (node_name ? node_name : "");
  request.node = node;
  // device= names GPUs: ask for exactly those (they wait when taken) rather than take any and then refuse it.
  // The local quota numbers its inventory by CUDA ordinal already.
  if (uses_gpu && !node.empty() && request.visible_devices.empty()) {
    request.node_gpus = node_gpu_indices(settings.device_ids(), local || visible == nullptr ? "" : visible);
  }
  request.memory_gib = settings.lease.memory_gib;
  request.priority = quota::parse_priority(settings.lease.priority);
  request.preemptible = settings.lease.preemptible;
  request.justification = settings.lease.justification;
  request.idempotency_key = job_name + "-" + std::to_string(getpid()) + "-" +
                            std::to_string(std::chrono::system_clock::now().time_since_epoch().count());
  std::cout << "Asking " << (settings.lease.quota == "local" ? std::string("the local quota") : settings.lease.quota)
            << " for a lease: team " << (request.team.empty() ? "local" : request.team) << ", " << request.model << ", "
            << request.gpus << " GPU, priority " << settings.lease.priority << "\n";
  // SIGTERM while queued or while quotad is unavailable: nothing to checkpoint yet; give up the place and exit as
  // preempted.
  const auto check_stop = [] {
    if (stop_requested()) throw StoppedWhileWaiting();
  };
  quota::RetryHooks retry;
  retry.check = check_stop;
  retry.on_retry = [](const quota::RetryInfo& info) {
    std::cout << "  quotad unavailable (" << (info.status != 0 ? std::to_string(info.status) + ": " : "") << info.reason
              << "): retrying in " << std::ceil(info.retry_in_s) << " s, giving up in "
              << std::lround(info.give_up_in_s) << " s" << std::endl;
  };
  const quota::LeaseInfo lease = client_->acquire(
      request,
      [&check_stop](const quota::WaitInfo& wait) {
        check_stop();
        std::cout << "  waiting (" << wait.status << ", position " << wait.position << "): " << wait.reason
                  << std::endl;
      },
      7 * 24 * 3600.0, retry);
  std::string devices;
  for (const auto& device : lease.devices) devices += (devices.empty() ? "" : ",") + device;
  std::cout << "Lease " << lease.id << " granted: " << (lease.shared ? "a share of " : "") << lease.devices.size()
            << " GPU (" << devices << "), " << lease.memory_gib << " GiB each, heartbeat every "
            << lease.heartbeat_interval_s << " s\n";
  if (!lease.memory_row.empty()) std::cout << "  admission used the " << lease.memory_row << "\n";
  // The trainer uses exactly the leased GPUs: a device= that says otherwise is a mistake to fix, not to run with.
  // The local quota's inventory is numbered by CUDA ordinal, quotad's by the node's physical index.
  if (uses_gpu) {
    try {
      devices_ =
          bind_leased_devices(lease.devices, node, settings.device_ids(), local || visible == nullptr ? "" : visible,
                              !local && !request.visible_devices.empty());
    } catch (const SettingsError&) {
      client_->release(quota::Outcome::kCancelled);
      released_ = true;
      throw;
    }
  }
  // Utilisation from the leased devices (NVML) when the run uses a GPU and the driver's library loads; the busy
  // share of each heartbeat interval otherwise. Sampled on the heartbeat thread, once per interval.
  std::unique_ptr<Nvml> nvml;
  std::vector<std::string> nvml_devices;
  if (uses_gpu) {
    std::string why;
    nvml = Nvml::load(kNvmlLibrary, &why);
    std::vector<int> cuda_ids = devices_.ordinals.empty() ? settings.device_ids() : devices_.ordinals;
    if (cuda_ids.empty()) cuda_ids = {0};
    nvml_devices = nvml_device_names(cuda_ids, visible ? visible : "", cuda_device_uuid);
    if (!nvml) std::cout << "Utilisation: NVML unavailable (" << why << "); reporting the busy share of the time\n";
  }
  auto sampler = std::make_shared<UtilisationSampler>(std::move(nvml), std::move(nvml_devices), monotonic_seconds());
  // what the memory peak was measured with (quotad memory-table --observed learns from it)
  quota::Telemetry context;
  context.model = request.model;
  context.imgsz = request.imgsz;
  context.amp = settings.amp && uses_gpu ? 1 : 0;  // GPU memory context: CPU runs hold no lease
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
    // rank 0's own process: two shared leases on one GPU each report their own, not the device's sum
    telemetry.process_memory_used_gib = reading.process_memory_used_gib;
    telemetry.last_checkpoint_ms = telemetry_.last_checkpoint_ms.load();
    return telemetry;
  });
}

TrainingLease::~TrainingLease() {
  if (client_ && !released_) {
    try {
      const quota::ReleaseAnswer answer = client_->release(quota::Outcome::kFailed);
      if (quota::is_unavailable(answer.status)) remember_unreleased(quota::Outcome::kFailed);
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
  const quota::ReleaseAnswer answer = client_->release(outcome);
  const int64_t id = client_->lease().id;
  if (id == 0) return;
  // "released" only when quotad said so: otherwise the GPUs stay held there until the lease expires
  std::cout << "Lease " << id;
  if (answer.acknowledged && answer.released_now) {
    std::cout << " released (" << quota::to_string(outcome) << ")\n";
  } else if (answer.acknowledged) {
    std::cout << " had already ended on quotad (" << answer.state << ")\n";
  } else if (quota::is_unavailable(answer.status)) {
    std::cout << " release not acknowledged (" << answer.reason << "): quotad expires it " << client_->lease().ttl_s
              << " s after its last acknowledged heartbeat, at " << utc_time(client_->expires_at_ms());
    if (remember_unreleased(outcome))
      std::cout << "; the next run here releases it (" << unreleased_file_.string() << ")";
    std::cout << "\n";
  } else {
    std::cout << " release refused (" << answer.reason << ")\n";
  }
  std::cout.flush();
}

bool TrainingLease::remember_unreleased(quota::Outcome outcome) {
  if (unreleased_file_.empty() || client_->lease().id == 0) return false;
  const nlohmann::json record{{"lease_id", client_->lease().id},
                              {"quota", quota_},
                              {"outcome", quota::to_string(outcome)},
                              {"expires_at", utc_time(client_->expires_at_ms())}};
  // written whole or not at all: the next run reads a record or none
  std::error_code error;
  const std::filesystem::path part = unreleased_file_.string() + ".part";
  std::filesystem::create_directories(unreleased_file_.parent_path(), error);
  {
    std::ofstream out(part, std::ios::trunc);
    out << record.dump() << "\n";
    if (!out.flush()) return false;
  }
  std::filesystem::rename(part, unreleased_file_, error);
  return !error;
}

void TrainingLease::release_earlier_lease() {
  if (unreleased_file_.empty() || !std::filesystem::exists(unreleased_file_)) return;
  const std::string file = unreleased_file_.string();
  std::ifstream in(unreleased_file_);
  const nlohmann::json record = nlohmann::json::parse(in, nullptr, false);
  const int64_t id = record.is_object() ? record.value("lease_id", int64_t{0}) : 0;
  const std::string quota = record.is_object() ? record.value("quota", "") : "";
  std::error_code error;
  if (id <= 0) {
    std::cout << file << " names no lease: removed\n";
    std::filesystem::remove(unreleased_file_, error);
    return;
  }
  std::cout << "Lease " << id << " of an earlier run here (its release was not acknowledged): ";
  if (quota != quota_) {
    std::cout << "asked of " << quota << ", not of quota=" << quota_ << "; left to expire there\n";
    std::filesystem::remove(unreleased_file_, error);
    return;
  }
  quota::Outcome outcome = quota::Outcome::kFailed;
  try {
    outcome = quota::parse_outcome(record.value("outcome", "failed"));
  } catch (const std::exception&) {
    outcome = quota::Outcome::kFailed;
  }
  const quota::ReleaseAnswer answer = client_->release_earlier(id, outcome);
  if (answer.acknowledged && answer.released_now) {
    std::cout << "released now (" << quota::to_string(outcome) << ")\n";
  } else if (answer.acknowledged) {
    std::cout << "had already ended on quotad (" << answer.state << ")\n";
  } else if (quota::is_unavailable(answer.status)) {
    std::cout << "release not acknowledged again (" << answer.reason << "); kept in " << file << "\n";
    return;
  } else {
    std::cout << "release refused (" << answer.reason << ")\n";
  }
  std::filesystem::remove(unreleased_file_, error);
}

}  // namespace yolo8
