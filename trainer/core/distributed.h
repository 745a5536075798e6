#pragma once
// Multi-process data-parallel training over LibTorch's c10d: Gloo on CPU, NCCL on CUDA. A process learns its
// place from the environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT, as torchrun and a
// Kubernetes indexed Job set them) or from explicit values. With world_size()==1 every call is a no-op, so
// the training run calls the same functions in single-process runs. c10d headers stay in distributed.cpp.

#include <torch/torch.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trainer/core/gradient_sync.h"
#include "trainer/core/stop_signal.h"

namespace yolo8 {

struct DistributedConfig {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // Bounds the rendezvous (every rank must reach the TCPStore of rank 0) and each collective.
  // Ranks other than 0 wait in their next collective while rank 0 validates, so this must exceed a validation.
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};
  std::string backend = "auto";  // auto (nccl on CUDA, gloo on CPU), gloo, nccl

  // Throws std::invalid_argument naming the field when a value is out of range.
  void validate() const;
};

// Reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT and, optionally, YOLO8_DIST_TIMEOUT (seconds)
// and YOLO8_DIST_BACKEND. Neither RANK nor WORLD_SIZE set: a single process. When WORLD_SIZE > 1, RANK,
// MASTER_ADDR and MASTER_PORT are required; LOCAL_RANK defaults to RANK. Errors name the variable.
// `getenv` is injectable for tests.
DistributedConfig distributed_config_from_env(const std::function<const char*(const char*)>& getenv = nullptr);

// How gradients are combined across ranks. kMean suits a loss that is a mean over the local batch; the YOLO
// DetectionLoss is sum-like (scaled by the local batch size), for which kSum reproduces the single-process
// gradient of the global batch (the reference multiplies its loss by world size before DDP's mean instead).
enum class GradReduction { kMean, kSum };

class DistributedContext {
 public:
  // A single process: every collective is a no-op.
  DistributedContext();
  // Joins the process group (rank 0 hosts the TCPStore). `device` selects the backend under "auto" and is
  // where NCCL collectives run. Throws std::runtime_error naming MASTER_ADDR:MASTER_PORT on rendezvous failure.
  explicit DistributedContext(const DistributedConfig& config, torch::Device device = torch::kCPU);
  ~DistributedContext();
  DistributedContext(DistributedContext&&) noexcept;
  DistributedContext& operator=(DistributedContext&&) noexcept;
  DistributedContext(const DistributedContext&) = delete;
  DistributedContext& operator=(const DistributedContext&) = delete;

  static DistributedContext from_env(torch::Device device = torch::kCPU);

  int rank() const { return config_.rank; }
  int world_size() const { return config_.world_size; }
  int local_rank() const { return config_.local_rank; }
  bool enabled() const { return config_.world_size > 1; }
  bool is_main() const { return config_.rank == 0; }
  const DistributedConfig& config() const { return config_; }
  std::string backend_name() const;

  // Rank `root`'s parameters and buffers to every rank (after construction / loading weights, before the
  // optimizer and the EMA copy are built).
  void broadcast_parameters(torch::nn::Module& module, int root = 0);
  void broadcast_tensors(const std::vector<torch::Tensor>& tensors, int root = 0);

  // Combines the .grad of every parameter that requires grad, flattened into buckets of at most
  // `bucket_bytes`. A missing grad counts as zeros so that every rank reduces the same buckets.
  void average_gradients(torch::nn::Module& module, GradReduction reduction = GradReduction::kMean);
  void average_gradients(const std::vector<torch::Tensor>& parameters, GradReduction reduction = GradReduction::kMean);

  // True on every rank when any rank passes true: the stop decision at a step boundary.
  bool all_reduce_flag(bool local);
  // Mean over ranks of a (small) tensor, e.g. the logged loss items; returns a new tensor on the input's device.
  torch::Tensor all_reduce_mean(const torch::Tensor& tensor);
  torch::Tensor all_reduce_sum(const torch::Tensor& tensor);
  // Largest value over ranks.
  int64_t all_reduce_max(int64_t local);
  void barrier();

  int64_t bucket_bytes = 25LL << 20;

 private:
  friend class OverlappedGradReducer;
  struct Impl;
  DistributedConfig config_;
  std::unique_ptr<Impl> impl_;
};

// Gradients reduced while the backward that completes them still runs, bucket by bucket, as PyTorch's DDP does.
// Buckets hold the trainable parameters in reverse order (the order the backward produces their gradients) up to
// `bucket_bytes` each. During an armed backward a hook copies each arriving gradient, added to what the window's
// earlier passes accumulated (the sum autograd is about to store), into its bucket; a complete bucket's all-reduce
// starts at once, in bucket order on every rank, so the collectives pair up whatever order the hooks fire in.
// combine() reduces what never arrived (unused parameters: their accumulated gradient or zeros), waits and writes
// the sums into .grad: the values average_gradients gives (identical for two ranks, whose sums commute). A backward
// abandoned on any rank (out of memory) makes every rank fall back to average_gradients on its .grad for that
// window: one flag collective per window decides it, so the ranks' collectives stay paired.
class OverlappedGradReducer : public GradientSync {
 public:
  static constexpr int64_t kDefaultBucketBytes = 4LL << 20;

  OverlappedGradReducer(DistributedContext& context, GradReduction reduction,
                        int64_t bucket_bytes = kDefaultBucketBytes);
  ~OverlappedGradReducer() override;
  OverlappedGradReducer(const OverlappedGradReducer&) = delete;
  OverlappedGradReducer& operator=(const OverlappedGradReducer&) = delete;

  void before_final_backward(const std::vector<torch::Tensor>& trainable) override;
  void abandon_final_backward() override;
  void combine(const std::vector<torch::Tensor>& trainable) override;

  // The last window's figures: buckets, bytes all-reduced, and buckets whose all-reduce started before combine().
  int64_t buckets() const;
  int64_t bytes_per_window() const;
  int64_t buckets_started_during_backward() const { return started_early_; }

 private:
  struct Bucket;
  void bind(const std::vector<torch::Tensor>& trainable);
  void on_gradient(size_t parameter, const torch::Tensor& gradient);
  void start_ready_buckets();
  void start_bucket(size_t bucket);
  void reset();

  DistributedContext& context_;
  GradReduction reduction_;
  int64_t bucket_bytes_;
  std::vector<torch::Tensor> parameters_;  // bound on first use: the trainable parameters, in model order
  std::vector<unsigned> hooks_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;   // per parameter
  std::vector<int64_t> offset_of_;  // per parameter: its first element in the bucket
  std::vector<bool> arrived_;       // per parameter, this window
  bool armed_ = false, abandoned_ = false;
  size_t next_to_start_ = 0;
  int64_t started_early_ = 0;
};

// The stop decision at a step boundary; call it once per step on every rank, after the local checks that may
// call request_stop (signal, lease, time limit). Any rank's reason stops every rank; a preemption (signal,
// lease revoked, quota unreachable) outranks the time limit so that all ranks choose the same exit code, and
// a rank without a local reason records the agreed one with request_stop (a rank keeps its own first reason
// in stop_reason(), so the exit code must come from the returned value). Returns kNone to continue.
// Single process: stop_reason().
StopReason agree_on_stop(DistributedContext& context);

}  // namespace yolo8
