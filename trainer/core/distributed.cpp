#include "trainer/core/distributed.h"

// Each backend is built where its library's headers are present (cmake/Yolo8Torch.cmake): Gloo's from Debian's
// libgloo-dev (the wheel ships Gloo's code but not its headers), NCCL's from the CUDA toolkit. The c10d headers
// compile only with the USE_C10D_* switches, which LibTorch's CMake config does not export; they are defined here
// rather than as compile flags so every target keeps the shared precompiled header.
#ifdef YOLO8_HAVE_GLOO
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/version.h>
// YOLO8_HAVE_NCCL comes from cmake/Yolo8Torch.cmake, which checked nccl.h against the NCCL torch was built with.
#if defined(YOLO8_WITH_CUDA) && defined(YOLO8_HAVE_NCCL)
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL 1
#endif
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace yolo8 {

namespace {

// LibTorch 2.x split the collective implementations out of ProcessGroup into c10d::Backend; the collective
// calls used here are the same on both.
#if TORCH_VERSION_MAJOR >= 2
using CollectiveGroup = c10d::Backend;
#else
using CollectiveGroup = c10d::ProcessGroup;
#endif

int parse_int_variable(const char* name, const char* value, int min_value, int max_value) {
  if (value == nullptr || *value == '\0') {
    throw std::invalid_argument(std::string("environment variable ") + name + " is not set");
  }
  char* end = nullptr;
  errno = 0;
  const long parsed = std::strtol(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || parsed < min_value || parsed > max_value) {
    throw std::invalid_argument(std::string("environment variable ") + name + "='" + value +
                                "' is not an integer in [" + std::to_string(min_value) + ", " +
                                std::to_string(max_value) + "]");
  }
  return static_cast<int>(parsed);
}

[[maybe_unused]] bool is_loopback(const std::string& address) {
  return address == "localhost" || address.rfind("127.", 0) == 0 || address == "::1";
}

}  // namespace

void DistributedConfig::validate() const {
  if (world_size < 1) throw std::invalid_argument("WORLD_SIZE must be >= 1, got " + std::to_string(world_size));
  if (rank < 0 || rank >= world_size) {
    throw std::invalid_argument("RANK must be in [0, WORLD_SIZE-1=" + std::to_string(world_size - 1) + "], got " +
                                std::to_string(rank));
  }
  if (local_rank < 0) throw std::invalid_argument("LOCAL_RANK must be >= 0, got " + std::to_string(local_rank));
  if (world_size > 1) {
    if (master_addr.empty()) throw std::invalid_argument("MASTER_ADDR is empty");
    if (master_port < 1 || master_port > 65535) {
      throw std::invalid_argument("MASTER_PORT must be in [1, 65535], got " + std::to_string(master_port));
    }
  }
  if (timeout.count() <= 0) throw std::invalid_argument("distributed timeout must be positive");
  if (backend != "auto" && backend != "gloo" && backend != "nccl") {
    throw std::invalid_argument("distributed backend must be auto, gloo or nccl, got '" + backend + "'");
  }
}

DistributedConfig distributed_config_from_env(const std::function<const char*(const char*)>& getenv) {
  const auto get = [&](const char* name) -> const char* {
    const char* value = getenv ? getenv(name) : std::getenv(name);
    return (value != nullptr && *value != '\0') ? value : nullptr;
  };
  DistributedConfig config;
  const char* world = get("WORLD_SIZE");
  const char* rank = get("RANK");
  if (world == nullptr && rank == nullptr) return config;
  if (world == nullptr) throw std::invalid_argument("environment variable WORLD_SIZE is not set (RANK is)");
  config.world_size = parse_int_variable("WORLD_SIZE", world, 1, 1 << 20);
  if (config.world_size == 1 && rank == nullptr) return config;
  config.rank = parse_int_variable("RANK", rank, 0, config.world_size - 1);
  const char* local = get("LOCAL_RANK");
  config.local_rank = local ? parse_int_variable("LOCAL_RANK", local, 0, 1 << 20) : config.rank;
  if (config.world_size > 1) {
    const char* addr = get("MASTER_ADDR");
    if (addr == nullptr) throw std::invalid_argument("environment variable MASTER_ADDR is not set");
    config.master_addr = addr;
    config.master_port = parse_int_variable("MASTER_PORT", get("MASTER_PORT"), 1, 65535);
  }
  if (const char* seconds = get("YOLO8_DIST_TIMEOUT")) {
    config.timeout = std::chrono::seconds(parse_int_variable("YOLO8_DIST_TIMEOUT", seconds, 1, 86400));
  }
  if (const char* backend = get("YOLO8_DIST_BACKEND")) config.backend = backend;
  config.validate();
  return config;
}

struct DistributedContext::Impl {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<CollectiveGroup> group;
  torch::Device device = torch::kCPU;  // where collectives run: CPU for Gloo, the GPU for NCCL
  std::string backend;

  // Collectives take tensors on the backend's device; results are copied back by the callers.
  torch::Tensor to_comm(const torch::Tensor& tensor) const { return tensor.to(device).contiguous(); }

  void all_reduce_sum_inplace(torch::Tensor& tensor) {
    std::vector<torch::Tensor> tensors{tensor};
    group->allreduce(tensors)->wait();
  }
};

DistributedContext::DistributedContext() = default;
DistributedContext::~DistributedContext() = default;
DistributedContext::DistributedContext(DistributedContext&&) noexcept = default;
DistributedContext& DistributedContext::operator=(DistributedContext&&) noexcept = default;

DistributedContext::DistributedContext(const DistributedConfig& config, torch::Device device) : config_(config) {
  config_.validate();
  if (!enabled()) return;
  auto impl = std::make_unique<Impl>();
  std::string backend = config_.backend;
  if (backend == "auto") backend = device.is_cuda() ? "nccl" : "gloo";
  impl->backend = backend;
  const std::string where = config_.master_addr + ":" + std::to_string(config_.master_port);
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<std::uint16_t>(config_.master_port);
    store_options.isServer = config_.rank == 0;
    store_options.numWorkers = static_cast<std::size_t>(config_.world_size);
    store_options.waitWorkers = true;
    store_options.timeout = config_.timeout;
    impl->store = c10::make_intrusive<c10d::TCPStore>(config_.master_addr, store_options);
  } catch (const std::exception& error) {
    throw std::runtime_error("distributed rendezvous at MASTER_ADDR:MASTER_PORT=" + where + " (rank " +
                             std::to_string(config_.rank) + " of " + std::to_string(config_.world_size) +
                             ") failed within " + std::to_string(config_.timeout.count() / 1000) +
                             " s: " + error.what());
  }
  try {
    if (backend == "gloo") {
#ifdef YOLO8_HAVE_GLOO
      auto options = c10d::ProcessGroupGloo::Options::create(config_.timeout);
      // A loopback master means a single machine; elsewhere GLOO_SOCKET_IFNAME picks the interface or the
      // host name decides, as with torchrun.
      const char* interface = std::getenv("GLOO_SOCKET_IFNAME");
      if (interface != nullptr && *interface != '\0') {
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(interface));
      } else if (is_loopback(config_.master_addr)) {
        options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      } else {
        options->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      }
      impl->group = c10::make_intrusive<c10d::ProcessGroupGloo>(impl->store, config_.rank, config_.world_size, options);
      impl->device = torch::kCPU;
#else
      throw std::invalid_argument(
          "this yolo8 was built without Gloo (no gloo/config.h at build time): "
          "data-parallel CPU training needs it (Debian: libgloo-dev)");
#endif
    } else if (backend == "nccl") {
#ifdef YOLO8_HAVE_NCCL
      if (!device.is_cuda()) throw std::invalid_argument("the nccl backend needs a CUDA device");
      auto options = c10d::ProcessGroupNCCL::Options::create();
      options->timeout = config_.timeout;
      impl->group = c10::make_intrusive<c10d::ProcessGroupNCCL>(impl->store, config_.rank, config_.world_size, options);
      impl->device = device;
#else
      throw std::invalid_argument("the nccl backend needs a CUDA build of yolo8 with NCCL's headers (nccl.h)");
#endif
    }
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::exception& error) {
    throw std::runtime_error("creating the " + backend + " process group (rank " + std::to_string(config_.rank) +
                             " of " + std::to_string(config_.world_size) + ", master " + where +
                             ") failed: " + error.what());
  }
  impl_ = std::move(impl);
}

DistributedContext DistributedContext::from_env(torch::Device device) {
  return DistributedContext(distributed_config_from_env(), device);
}

std::string DistributedContext::backend_name() const { return impl_ ? impl_->backend : "none"; }

void DistributedContext::broadcast_tensors(const std::vector<torch::Tensor>& tensors, int root) {
  if (!enabled() || tensors.empty()) return;
  if (root < 0 || root >= world_size()) throw std::invalid_argument("broadcast root out of range");
  torch::NoGradGuard no_grad;
  for (const auto& tensor : tensors) {
    std::vector<torch::Tensor> payload{impl_->to_comm(tensor)};
    c10d::BroadcastOptions options;
    options.rootRank = root;
    impl_->group->broadcast(payload, options)->wait();
    if (config_.rank != root) tensor.copy_(payload[0]);
  }
}

void DistributedContext::broadcast_parameters(torch::nn::Module& module, int root) {
  if (!enabled()) return;
  std::vector<torch::Tensor> tensors = module.parameters(/*recurse=*/true);
  for (const auto& buffer : module.buffers(/*recurse=*/true)) {
    if (buffer.defined()) tensors.push_back(buffer);
  }
  broadcast_tensors(tensors, root);
}

void DistributedContext::average_gradients(torch::nn::Module& module, GradReduction reduction) {
  average_gradients(module.parameters(/*recurse=*/true), reduction);
}

void DistributedContext::average_gradients(const std::vector<torch::Tensor>& parameters, GradReduction reduction) {
  if (!enabled()) return;
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> grads;
  for (const auto& parameter : parameters) {
    if (!parameter.requires_grad()) continue;
    if (!parameter.grad().defined()) parameter.mutable_grad() = torch::zeros_like(parameter);
    grads.push_back(parameter.grad());
  }
  // Buckets of one dtype: one flat copy, one collective, one scatter back per bucket.
  size_t begin = 0;
  while (begin < grads.size()) {
    size_t end = begin;
    int64_t bytes = 0;
    while (end < grads.size() && grads[end].scalar_type() == grads[begin].scalar_type() &&
           (end == begin || bytes + grads[end].nbytes() <= static_cast<uint64_t>(bucket_bytes))) {
      bytes += static_cast<int64_t>(grads[end].nbytes());
      ++end;
    }
    std::vector<torch::Tensor> pieces;
    pieces.reserve(end - begin);
    for (size_t i = begin; i < end; ++i) pieces.push_back(grads[i].reshape({-1}).to(impl_->device));
    torch::Tensor flat = torch::cat(pieces);
    impl_->all_reduce_sum_inplace(flat);
    if (reduction == GradReduction::kMean) flat.div_(world_size());
    int64_t offset = 0;
    for (size_t i = begin; i < end; ++i) {
      const int64_t count = grads[i].numel();
      grads[i].copy_(flat.slice(0, offset, offset + count).view(grads[i].sizes()));
      offset += count;
    }
    begin = end;
  }
}

// ----------------------------------------------------------------------------------------------------------------
// OverlappedGradReducer

struct OverlappedGradReducer::Bucket {
  std::vector<size_t> parameters;  // indices into parameters_
  torch::Tensor flat;              // on the backend's device; reused every window
  int64_t pending = 0;             // parameters yet to arrive this window
  bool started = false;
  c10::intrusive_ptr<c10d::Work> work;
};

OverlappedGradReducer::OverlappedGradReducer(DistributedContext& context, GradReduction reduction, int64_t bucket_bytes)
    : context_(context), reduction_(reduction), bucket_bytes_(std::max<int64_t>(1, bucket_bytes)) {}

OverlappedGradReducer::~OverlappedGradReducer() {
  for (size_t i = 0; i < hooks_.size(); ++i) parameters_[i].remove_hook(hooks_[i]);
}

int64_t OverlappedGradReducer::buckets() const { return static_cast<int64_t>(buckets_.size()); }

int64_t OverlappedGradReducer::bytes_per_window() const {
  int64_t bytes = 0;
  for (const Bucket& bucket : buckets_) bytes += static_cast<int64_t>(bucket.flat.nbytes());
  return bytes;
}

void OverlappedGradReducer::bind(const std::vector<torch::Tensor>& trainable) {
  if (!parameters_.empty()) {
    if (trainable.size() != parameters_.size()) {
      throw std::logic_error("OverlappedGradReducer: the trainable parameters changed between windows");
    }
    return;
  }
  parameters_ = trainable;
  bucket_of_.assign(parameters_.size(), 0);
  offset_of_.assign(parameters_.size(), 0);
  arrived_.assign(parameters_.size(), false);
  // reverse model order, one dtype per bucket
  for (size_t k = parameters_.size(); k-- > 0;) {
    const torch::Tensor& p = parameters_[k];
    Bucket* last = buckets_.empty() ? nullptr : &buckets_.back();
    const bool fits = last != nullptr && last->flat.scalar_type() == p.scalar_type() &&
                      (last->flat.numel() + p.numel()) * p.element_size() <= bucket_bytes_;
    if (!fits) {
      buckets_.emplace_back();
      buckets_.back().flat = torch::empty({0}, p.options().device(context_.impl_->device).requires_grad(false));
      last = &buckets_.back();
    }
    bucket_of_[k] = buckets_.size() - 1;
    offset_of_[k] = last->flat.numel();
    last->parameters.push_back(k);
    last->flat = torch::empty({last->flat.numel() + p.numel()}, last->flat.options());
  }
  for (size_t k = 0; k < parameters_.size(); ++k) {
    hooks_.push_back(
        parameters_[k].register_hook([this, k](const torch::Tensor& gradient) { on_gradient(k, gradient); }));
  }
  reset();
}

void OverlappedGradReducer::reset() {
  armed_ = abandoned_ = false;
  next_to_start_ = 0;
  std::fill(arrived_.begin(), arrived_.end(), false);
  for (Bucket& bucket : buckets_) {
    bucket.pending = static_cast<int64_t>(bucket.parameters.size());
    bucket.started = false;
    bucket.work.reset();
  }
}

void OverlappedGradReducer::before_final_backward(const std::vector<torch::Tensor>& trainable) {
  if (!context_.enabled()) return;
  bind(trainable);
  if (!abandoned_) armed_ = true;  // after an abandoned backward this window reduces the plain way
  started_early_ = 0;
}

// Runs in the backward (autograd's thread for the device) before autograd adds `gradient` to .grad.
void OverlappedGradReducer::on_gradient(size_t parameter, const torch::Tensor& gradient) {
  if (!armed_ || arrived_[parameter]) return;
  torch::NoGradGuard no_grad;
  Bucket& bucket = buckets_[bucket_of_[parameter]];
  const int64_t count = parameters_[parameter].numel();
  torch::Tensor slot = bucket.flat.slice(0, offset_of_[parameter], offset_of_[parameter] + count);
  const torch::Tensor& accumulated = parameters_[parameter].grad();
  if (accumulated.defined()) {
    slot.copy_(accumulated.reshape({-1}));
    slot.add_(gradient.reshape({-1}));  // the same sum autograd stores: earlier passes + this one
  } else {
    slot.copy_(gradient.reshape({-1}));
  }
  arrived_[parameter] = true;
  if (--bucket.pending == 0) {
    start_ready_buckets();
    started_early_ = static_cast<int64_t>(next_to_start_);
  }
}

void OverlappedGradReducer::start_ready_buckets() {
  while (next_to_start_ < buckets_.size() && buckets_[next_to_start_].pending == 0) start_bucket(next_to_start_++);
}

void OverlappedGradReducer::start_bucket(size_t index) {
  Bucket& bucket = buckets_[index];
  std::vector<torch::Tensor> tensors{bucket.flat};
  bucket.work = context_.impl_->group->allreduce(tensors);
  bucket.started = true;
}

void OverlappedGradReducer::abandon_final_backward() {
  if (!armed_) return;
  // the other ranks' collectives for this window are (or will be) started: start ours too, contents unused
  armed_ = false;
  abandoned_ = true;
  for (; next_to_start_ < buckets_.size(); ++next_to_start_) start_bucket(next_to_start_);
}

void OverlappedGradReducer::combine(const std::vector<torch::Tensor>& trainable) {
  if (!context_.enabled()) return;
  bind(trainable);
  torch::NoGradGuard no_grad;
  armed_ = false;
  // what did not arrive during the backward (or the whole window when it was never armed): the accumulated .grad
  for (size_t k = 0; k < parameters_.size(); ++k) {
    Bucket& bucket = buckets_[bucket_of_[k]];
    if (arrived_[k] || bucket.started) continue;
    const int64_t count = parameters_[k].numel();
    torch::Tensor slot = bucket.flat.slice(0, offset_of_[k], offset_of_[k] + count);
    const torch::Tensor& accumulated = parameters_[k].grad();
    if (accumulated.defined()) {
      slot.copy_(accumulated.reshape({-1}));
    } else {
      slot.zero_();
    }
    arrived_[k] = true;
    --bucket.pending;
  }
  for (; next_to_start_ < buckets_.size(); ++next_to_start_) start_bucket(next_to_start_);
  for (Bucket& bucket : buckets_) bucket.work->wait();
  if (context_.all_reduce_flag(abandoned_)) {
    reset();
    context_.average_gradients(parameters_, reduction_);
    return;
  }
  for (Bucket& bucket : buckets_) {
    if (reduction_ == GradReduction::kMean) bucket.flat.div_(context_.world_size());
  }
  for (size_t k = 0; k < parameters_.size(); ++k) {
    const torch::Tensor& p = parameters_[k];
    const torch::Tensor slot =
        buckets_[bucket_of_[k]].flat.slice(0, offset_of_[k], offset_of_[k] + p.numel()).view(p.sizes());
    if (p.grad().defined()) {
      p.mutable_grad().copy_(slot);
    } else {
      p.mutable_grad() = slot.to(p.device()).clone().contiguous(p.suggest_memory_format());
    }
  }
  reset();
}

bool DistributedContext::all_reduce_flag(bool local) {
  if (!enabled()) return local;
  torch::Tensor flag = torch::full({1}, local ? 1 : 0, torch::TensorOptions().dtype(torch::kInt).device(impl_->device));
  impl_->all_reduce_sum_inplace(flag);
  return flag.item<int>() > 0;
}

torch::Tensor DistributedContext::all_reduce_sum(const torch::Tensor& tensor) {
  if (!enabled()) return tensor.clone();
  torch::NoGradGuard no_grad;
  torch::Tensor work = impl_->to_comm(tensor.detach()).clone();
  impl_->all_reduce_sum_inplace(work);
  return work.to(tensor.device());
}

torch::Tensor DistributedContext::all_reduce_mean(const torch::Tensor& tensor) {
  if (!enabled()) return tensor.clone();
  torch::Tensor sum = all_reduce_sum(tensor.is_floating_point() ? tensor : tensor.to(torch::kFloat));
  return sum.div_(world_size());
}

int64_t DistributedContext::all_reduce_max(int64_t local) {
  if (!enabled()) return local;
  torch::Tensor value = torch::full({1}, local, torch::TensorOptions().dtype(torch::kLong).device(impl_->device));
  std::vector<torch::Tensor> tensors{value};
  c10d::AllreduceOptions options;
  options.reduceOp = c10d::ReduceOp::MAX;
  impl_->group->allreduce(tensors, options)->wait();
  return value.item<int64_t>();
}

StopReason agree_on_stop(DistributedContext& context) {
  if (!context.enabled()) return stop_reason();
  // Priority: 0 continue, 1 time limit, 10 + reason for the preemptions (which exit 75).
  const StopReason local = stop_reason();
  const int64_t mine = local == StopReason::kNone        ? 0
                       : local == StopReason::kTimeLimit ? 1
                                                         : 10 + static_cast<int64_t>(local);
  const int64_t agreed = context.all_reduce_max(mine);
  if (agreed == 0) return StopReason::kNone;
  const StopReason reason = agreed == 1 ? StopReason::kTimeLimit : static_cast<StopReason>(agreed - 10);
  request_stop(reason);
  return reason;
}

void DistributedContext::barrier() {
  if (!enabled()) return;
  impl_->group->barrier()->wait();
}

// ---------------------------------------------------------------------------------------------------------
// Launcher

}  // namespace yolo8
