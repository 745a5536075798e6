// Data-parallel training over c10d/Gloo on loopback: the launcher re-executes this test binary as two ranks
// (DistributedWorker.Run, which skips unless YOLO8_DDP_WORKER is set) and the parent compares their results
// with one process stepping on the whole global batch.

#include "trainer/core/distributed.h"

#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "models/yolo.h"
#include "trainer/core/train_step.h"
#include "trainer/detect/loss.h"
#include "trainer/run/launcher.h"

namespace yolo8 {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kGlobalBatch = 8;
constexpr int kOptimizerSteps = 5;
constexpr int kAccumulate = 2;
constexpr int kStopStep = 7;

struct TinyNetImpl : torch::nn::Module {
  TinyNetImpl() {
    conv1 = register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).padding(1)));
    conv2 = register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 4, 3).stride(2).padding(1)));
    head = register_module("head", torch::nn::Linear(4 * 4 * 4, 5));
    scale = register_buffer("scale", torch::rand({5}) + 0.5);
  }
  // x: B×3×8×8 → B×5
  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = torch::silu(conv1->forward(x));
    y = torch::silu(conv2->forward(y));
    return head->forward(y.flatten(1)) * scale;
  }
  torch::nn::Conv2d conv1{nullptr}, conv2{nullptr};
  torch::nn::Linear head{nullptr};
  torch::Tensor scale;
};
TORCH_MODULE(TinyNet);

// The global batch of micro-step `micro`, identical in every process.
std::pair<torch::Tensor, torch::Tensor> global_batch(int micro) {
  torch::Generator generator = torch::make_generator<torch::CPUGeneratorImpl>(1000 + micro);
  torch::Tensor x = torch::randn({kGlobalBatch, 3, 8, 8}, generator, torch::kFloat);
  torch::Tensor y = torch::randn({kGlobalBatch, 5}, generator, torch::kFloat);
  return {x, y};
}

std::vector<torch::Tensor> state_of(const TinyNet& net) {
  std::vector<torch::Tensor> state;
  for (const auto& p : net->parameters()) state.push_back(p.detach().clone());
  for (const auto& b : net->buffers()) state.push_back(b.detach().clone());
  return state;
}

// Trains `net` on rows [begin, end) of every global batch; `sum_like` scales the mean loss by the number of
// rows, as the YOLO loss does. `context` (may be disabled) combines the gradients before each optimizer step.
void train(TinyNet& net, int64_t begin, int64_t end, bool sum_like, DistributedContext& context) {
  torch::optim::SGD optimizer(net->parameters(),
                              torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true).weight_decay(5e-4));
  int micro = 0;
  for (int step = 0; step < kOptimizerSteps; ++step) {
    for (int a = 0; a < kAccumulate; ++a, ++micro) {
      auto batch = global_batch(micro);
      torch::Tensor x = batch.first.slice(0, begin, end);
      torch::Tensor y = batch.second.slice(0, begin, end);
      torch::Tensor loss = torch::mse_loss(net->forward(x), y);
      if (sum_like) loss = loss * static_cast<double>(end - begin);
      loss.backward();
    }
    context.average_gradients(*net, sum_like ? GradReduction::kSum : GradReduction::kMean);
    torch::nn::utils::clip_grad_norm_(net->parameters(), 1.0);
    optimizer.step();
    optimizer.zero_grad();
  }
}

TinyNet fresh_net(int seed) {
  torch::manual_seed(seed);
  return TinyNet();
}

void save_state(const std::vector<torch::Tensor>& state, const fs::path& path) {
  auto copy = state;
  torch::save(copy, path.string());
}

std::vector<torch::Tensor> load_state(const fs::path& path) {
  std::vector<torch::Tensor> state;
  torch::load(state, path.string());
  return state;
}

double max_difference(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    EXPECT_EQ(a[i].sizes(), b[i].sizes());
    worst = std::max(worst, (a[i] - b[i]).abs().max().item<double>());
  }
  return worst;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("yolo8_ddp_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

LaunchOptions worker_options(const std::string& mode, const fs::path& dir) {
  LaunchOptions options;
  options.extra_env = {{"YOLO8_DDP_WORKER", mode}, {"YOLO8_DDP_DIR", dir.string()}, {"YOLO8_DIST_TIMEOUT", "60"}};
  options.timeout = std::chrono::seconds(180);
  options.failure_grace = std::chrono::seconds(5);
  return options;
}

const std::vector<std::string> kWorkerArgs = {"--gtest_filter=DistributedWorker.Run"};

// ---------------------------------------------------------------------------------------------------------
// The rank processes.

// yolov8n as the trainer runs it: channels-last, DFL frozen, in training mode; returns the trainable parameters.
std::vector<torch::Tensor> as_the_trainer_runs_it(DetectionModel& model) {
  to_channels_last(*model);
  std::vector<torch::Tensor> trainable;
  for (auto& item : model->named_parameters()) {
    const bool frozen = item.key().find(".dfl") != std::string::npos;
    item.value().set_requires_grad(!frozen);
    if (!frozen) trainable.push_back(item.value());
  }
  model->train();
  return trainable;
}

// Rank `rank`'s `local` images of a global batch drawn from `seed` (channels-last), and the labels of its images:
// two boxes per image (image index, class, cx, cy, w, h).
std::pair<torch::Tensor, torch::Tensor> rank_batch(uint64_t seed, int64_t local, int rank, int64_t imgsz) {
  torch::Generator generator = torch::make_generator<torch::CPUGeneratorImpl>(seed);
  const torch::Tensor images = torch::rand({2 * local, 3, imgsz, imgsz}, generator, torch::kFloat);
  const torch::Tensor image_index = torch::arange(local, torch::kFloat).repeat_interleave(2).unsqueeze(1);
  const torch::Tensor rest = torch::rand({2 * local, 5}, generator, torch::kFloat) * 0.4 + 0.3;
  const torch::Tensor labels = torch::cat({image_index, rest.slice(1, 0, 1).round(), rest.slice(1, 1, 5)}, 1);
  return {images.slice(0, rank * local, (rank + 1) * local).contiguous(torch::MemoryFormat::ChannelsLast), labels};
}

TEST(DistributedWorker, Run) {
  const char* mode_value = std::getenv("YOLO8_DDP_WORKER");
  if (mode_value == nullptr) GTEST_SKIP() << "only runs as a rank started by the Distributed tests";
  const std::string mode = mode_value;
  const fs::path dir = std::getenv("YOLO8_DDP_DIR");
  torch::set_num_threads(1);
  DistributedContext context = DistributedContext::from_env(torch::kCPU);
  ASSERT_EQ(context.world_size(), 2);
  ASSERT_EQ(context.backend_name(), "gloo");
  const int rank = context.rank();
  const int64_t half = kGlobalBatch / context.world_size();

  if (mode == "match") {
    for (const bool sum_like : {false, true}) {
      TinyNet net = fresh_net(100 + rank);                    // deliberately different until the broadcast
      context.bucket_bytes = sum_like ? 1024 : (25LL << 20);  // many small buckets, then one
      context.broadcast_parameters(*net);
      save_state(state_of(net), dir / ("init" + std::to_string(sum_like) + "_rank" + std::to_string(rank) + ".pt"));
      train(net, rank * half, (rank + 1) * half, sum_like, context);
      save_state(state_of(net), dir / ("final" + std::to_string(sum_like) + "_rank" + std::to_string(rank) + ".pt"));
    }
    torch::Tensor mean = context.all_reduce_mean(torch::tensor({static_cast<float>(rank), 10.0f * rank}));
    std::ofstream(dir / ("mean_rank" + std::to_string(rank) + ".txt"))
        << mean[0].item<float>() << " " << mean[1].item<float>() << "\n";
    context.barrier();
    return;
  }
  if (mode == "yolo") {
    // yolov8n (nc 2) as the trainer runs it: channels-last, DFL frozen, the sum-like DetectionLoss and kSum.
    torch::manual_seed(500 + rank);
    DetectionModel model = build_model("yolov8n.yaml", 2);
    context.broadcast_parameters(*model);
    const std::vector<torch::Tensor> trainable = as_the_trainer_runs_it(model);
    LossConfig loss_config;
    loss_config.nc = 2;
    DetectionLoss loss(loss_config);
    torch::optim::SGD optimizer(trainable, torch::optim::SGDOptions(0.01).momentum(0.9).nesterov(true));
    const int64_t local = 2;
    for (int step = 0; step < 3; ++step) {
      const auto [x, labels] = rank_batch(2000 + step, local, rank, 64);
      const LossOutput out = loss(model->forward_maps(x), LossTargets::from_label_rows(labels));
      out.total.backward();
      context.average_gradients(trainable, GradReduction::kSum);
      torch::nn::utils::clip_grad_norm_(trainable, 10.0);
      optimizer.step();
      optimizer.zero_grad();
    }
    std::vector<torch::Tensor> state;
    for (const auto& p : model->parameters()) state.push_back(p.detach().contiguous().clone());
    save_state(state, dir / ("yolo_rank" + std::to_string(rank) + ".pt"));
    return;
  }
  if (mode == "overlap") {
    // yolov8n as the trainer runs it, two micro-batches per window, through TrainingCore-like calls of the
    // overlapped reducer; then the same windows with average_gradients after the backward. Rank 1 abandons its
    // armed backward in window 1 (as the out-of-memory guard does) and runs it again.
    const auto run = [&](bool overlapped, std::vector<double>& window_ms) {
      torch::manual_seed(600);
      DetectionModel model = build_model("yolov8n.yaml", 2);
      const std::vector<torch::Tensor> trainable = as_the_trainer_runs_it(model);
      LossConfig loss_config;
      loss_config.nc = 2;
      DetectionLoss loss(loss_config);
      torch::optim::SGD optimizer(trainable, torch::optim::SGDOptions(0.01).momentum(0.9).nesterov(true));
      OverlappedGradReducer reducer(context, GradReduction::kSum, 1LL << 20);
      const int64_t local = 2;
      for (int window = 0; window < 4; ++window) {
        const auto start = std::chrono::steady_clock::now();
        for (int micro = 0; micro < 2; ++micro) {
          const auto [x, labels] = rank_batch(3000 + 2 * window + micro, local, rank, 96);
          const bool last = micro == 1;
          if (overlapped && last) reducer.before_final_backward(trainable);
          std::vector<torch::Tensor> saved;
          for (const auto& p : trainable) saved.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
          loss(model->forward_maps(x), LossTargets::from_label_rows(labels)).total.backward();
          if (overlapped && last && window == 1 && rank == 1) {
            reducer.abandon_final_backward();
            for (size_t k = 0; k < trainable.size(); ++k) trainable[k].mutable_grad() = saved[k];
            reducer.before_final_backward(trainable);  // refused: this window reduces the plain way
            loss(model->forward_maps(x), LossTargets::from_label_rows(labels)).total.backward();
          }
        }
        if (overlapped) {
          reducer.combine(trainable);
        } else {
          context.average_gradients(trainable, GradReduction::kSum);
        }
        optimizer.step();
        optimizer.zero_grad();
        window_ms.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
      }
      std::vector<torch::Tensor> state;
      for (const auto& p : model->parameters()) state.push_back(p.detach().contiguous().clone());
      std::ofstream(dir / ("overlap_buckets_rank" + std::to_string(rank) + ".txt"))
          << reducer.buckets() << " " << reducer.bytes_per_window() << " " << reducer.buckets_started_during_backward()
          << "\n";
      return state;
    };
    std::vector<double> classic_ms, overlapped_ms;
    const auto classic = run(false, classic_ms);
    const auto overlapped = run(true, overlapped_ms);
    save_state(classic, dir / ("classic_rank" + std::to_string(rank) + ".pt"));
    save_state(overlapped, dir / ("overlapped_rank" + std::to_string(rank) + ".pt"));
    std::ofstream times(dir / ("overlap_ms_rank" + std::to_string(rank) + ".txt"));
    for (size_t i = 0; i < classic_ms.size(); ++i) times << classic_ms[i] << " " << overlapped_ms[i] << "\n";
    return;
  }
  if (mode == "bench") {
    // Gradients of about yolov8n's size (3.2M floats), channels-last like the trainer's conv weights.
    std::vector<torch::Tensor> params;
    for (int i = 0; i < 86; ++i) {
      torch::Tensor weight = torch::zeros({64, 64, 3, 3}).contiguous(torch::MemoryFormat::ChannelsLast);
      torch::Tensor bias = torch::zeros({64});
      params.push_back(weight.set_requires_grad(true));
      params.push_back(bias.set_requires_grad(true));
    }
    const auto pattern = [](const torch::Tensor& p, int index) {
      return torch::arange(p.numel(), torch::kFloat).reshape(p.sizes()).add_(index);
    };
    const auto fill = [&] {
      for (size_t i = 0; i < params.size(); ++i) {
        params[i].mutable_grad() = (pattern(params[i], static_cast<int>(i)) * static_cast<float>(rank + 1))
                                       .contiguous(params[i].suggest_memory_format());
      }
    };
    fill();
    context.average_gradients(params);
    double worst = 0.0;
    for (size_t i = 0; i < params.size(); ++i) {
      worst = std::max(worst,
                       (params[i].grad() - pattern(params[i], static_cast<int>(i)) * 1.5f).abs().max().item<double>());
    }
    const int repeats = 5;
    auto start = std::chrono::steady_clock::now();
    for (int r = 0; r < repeats; ++r) context.average_gradients(params);
    const double grad_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() / repeats;
    const int flags = 200;
    start = std::chrono::steady_clock::now();
    for (int r = 0; r < flags; ++r) context.all_reduce_flag(false);
    const double flag_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / flags;
    std::ofstream(dir / ("bench_rank" + std::to_string(rank) + ".txt"))
        << worst << " " << grad_ms << " " << flag_us << "\n";
    return;
  }
  if (mode == "stop") {
    // Rank 1 alone sees the "signal" at kStopStep; every rank must stop at that same step.
    int stopped_at = -1;
    for (int step = 0; step < 100; ++step) {
      const bool local = rank == 1 && step == kStopStep;
      if (context.all_reduce_flag(local)) {
        stopped_at = step;
        break;
      }
    }
    // Through the stop state the engine uses: rank 0 runs into its time limit at step 3 while rank 1 is
    // preempted there; both must agree on the preemption (exit 75), not on the time limit.
    reset_stop_state();
    int agreed_at = -1;
    StopReason reason = StopReason::kNone;
    for (int step = 0; step < 100; ++step) {
      if (step == 3 && rank == 1) request_stop(StopReason::kLeaseRevoked);
      if (step == 3 && rank == 0) request_stop(StopReason::kTimeLimit);
      reason = agree_on_stop(context);
      if (reason != StopReason::kNone) {
        agreed_at = step;
        break;
      }
    }
    if (!stop_requested()) reason = StopReason::kNone;
    context.barrier();  // as the engine does after rank 0's checkpoint: exit together
    std::ofstream(dir / ("stop_rank" + std::to_string(rank) + ".txt"))
        << stopped_at << " " << agreed_at << " " << to_string(reason) << "\n";
    std::exit(stopped_at >= 0 && reason == StopReason::kLeaseRevoked ? 75 : 1);
  }
  FAIL() << "unknown worker mode " << mode;
}

// ---------------------------------------------------------------------------------------------------------
// Two Gloo ranks against one process.

TEST(Distributed, TwoGlooRanksMatchOneProcessOnTheGlobalBatch) {
  torch::set_num_threads(1);
  const fs::path dir = fresh_dir("match");
  const auto start = std::chrono::steady_clock::now();
  ASSERT_EQ(launch_local_workers({0, 1}, kWorkerArgs, worker_options("match", dir)), 0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "two-rank run took " << seconds << " s\n";

  DistributedContext single;
  for (const bool sum_like : {false, true}) {
    const std::string tag = std::to_string(sum_like);
    TinyNet reference = fresh_net(100);
    const auto initial = state_of(reference);
    train(reference, 0, kGlobalBatch, sum_like, single);
    const auto expected = state_of(reference);
    // Rank 1 started from other weights: the broadcast made them rank 0's, buffers included.
    EXPECT_EQ(max_difference(load_state(dir / ("init" + tag + "_rank1.pt")), initial), 0.0);
    EXPECT_GT(max_difference(state_of(fresh_net(101)), initial), 1e-3);
    EXPECT_GT(max_difference(expected, initial), 1e-3) << "training must move the weights";
    for (int rank = 0; rank < 2; ++rank) {
      const auto got = load_state(dir / ("final" + tag + "_rank" + std::to_string(rank) + ".pt"));
      const double difference = max_difference(got, expected);
      std::cout << "rank " << rank << (sum_like ? " sum-like" : " mean") << " loss: max |w - w_single| = " << difference
                << "\n";
      EXPECT_LT(difference, 1e-5) << "rank " << rank << (sum_like ? " sum-like" : " mean") << " loss";
    }
  }
  // Without combining gradients a rank drifts away from the global-batch result.
  TinyNet alone = fresh_net(100);
  train(alone, 0, kGlobalBatch / 2, false, single);
  TinyNet reference = fresh_net(100);
  train(reference, 0, kGlobalBatch, false, single);
  EXPECT_GT(max_difference(state_of(alone), state_of(reference)), 1e-4);

  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(dir / ("mean_rank" + std::to_string(rank) + ".txt"));
    float a = -1, b = -1;
    in >> a >> b;
    EXPECT_FLOAT_EQ(a, 0.5f);
    EXPECT_FLOAT_EQ(b, 5.0f);
  }
  fs::remove_all(dir);
}

TEST(Distributed, TwoRanksTrainingYolov8nStayInLockstep) {
  const fs::path dir = fresh_dir("yolo");
  ASSERT_EQ(launch_local_workers({0, 1}, kWorkerArgs, worker_options("yolo", dir)), 0);
  const auto rank0 = load_state(dir / "yolo_rank0.pt");
  const auto rank1 = load_state(dir / "yolo_rank1.pt");
  const double difference = max_difference(rank0, rank1);
  std::cout << "yolov8n after 3 steps: max |w_rank0 - w_rank1| = " << difference << "\n";
  EXPECT_LT(difference, 1e-7);
  torch::manual_seed(500);
  DetectionModel initial = build_model("yolov8n.yaml", 2);
  std::vector<torch::Tensor> start;
  for (const auto& p : initial->parameters()) start.push_back(p.detach().clone());
  EXPECT_GT(max_difference(rank0, start), 1e-4) << "the steps must move the weights";
  fs::remove_all(dir);
}

// The overlapped reducer gives the gradients average_gradients gives, bit for bit (two ranks: their sums commute),
// also across a window whose armed backward rank 1 abandoned; its buckets start while the backward still runs.
TEST(Distributed, OverlappedReductionEqualsTheReductionAfterTheBackward) {
  const fs::path dir = fresh_dir("overlap");
  ASSERT_EQ(launch_local_workers({0, 1}, kWorkerArgs, worker_options("overlap", dir)), 0);
  for (int rank = 0; rank < 2; ++rank) {
    const std::string tag = "_rank" + std::to_string(rank) + ".pt";
    EXPECT_EQ(max_difference(load_state(dir / ("overlapped" + tag)), load_state(dir / ("classic" + tag))), 0.0)
        << "rank " << rank;
  }
  EXPECT_EQ(max_difference(load_state(dir / "overlapped_rank0.pt"), load_state(dir / "overlapped_rank1.pt")), 0.0);
  std::ifstream buckets(dir / "overlap_buckets_rank0.txt");
  int64_t count = 0, bytes = 0, early = 0;
  buckets >> count >> bytes >> early;
  EXPECT_GT(count, 4);           // yolov8n's 12 MB in 1 MB buckets
  EXPECT_GT(bytes, 11'000'000);  // every trainable float, once
  EXPECT_GT(early, count / 2);   // most buckets started before the backward ended
  std::ifstream times(dir / "overlap_ms_rank0.txt");
  double classic = 0, overlapped = 0, c = 0, o = 0;
  for (int window = 0; times >> c >> o; ++window) {
    if (window == 0 || window == 1) continue;  // warm-up, and the abandoned window
    classic += c;
    overlapped += o;
  }
  std::cout << "2 Gloo ranks, yolov8n 96 px, 2 images x 2 passes per window: " << classic / 2 << " ms a window with "
            << "the reduction after the backward, " << overlapped / 2 << " ms overlapped; " << count << " buckets, "
            << bytes << " bytes a window, " << early << " started during the backward\n";
}

TEST(Distributed, StopFlagRaisedOnRankOneStopsBothRanksAtTheSameStep) {
  const fs::path dir = fresh_dir("stop");
  EXPECT_EQ(launch_local_workers({0, 1}, kWorkerArgs, worker_options("stop", dir)), 75);
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(dir / ("stop_rank" + std::to_string(rank) + ".txt"));
    int step = -1, agreed_at = -1;
    std::string reason;
    in >> step >> agreed_at;
    std::getline(in >> std::ws, reason);
    EXPECT_EQ(step, kStopStep) << "rank " << rank;
    EXPECT_EQ(agreed_at, 3) << "rank " << rank;
    EXPECT_EQ(reason, "lease revoked") << "rank " << rank;
  }
  fs::remove_all(dir);
}

TEST(Distributed, AveragesChannelsLastGradientsOfYoloSizeAndReportsTheCost) {
  const fs::path dir = fresh_dir("bench");
  ASSERT_EQ(launch_local_workers({0, 1}, kWorkerArgs, worker_options("bench", dir)), 0);
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(dir / ("bench_rank" + std::to_string(rank) + ".txt"));
    double worst = -1, grad_ms = -1, flag_us = -1;
    in >> worst >> grad_ms >> flag_us;
    EXPECT_EQ(worst, 0.0) << "rank " << rank;
    EXPECT_GT(grad_ms, 0.0);
    std::cout << "rank " << rank << ": average_gradients of 3.18M floats " << grad_ms << " ms, all_reduce_flag "
              << flag_us << " us\n";
  }
  fs::remove_all(dir);
}

TEST(Distributed, RendezvousWithoutMasterTimesOutNamingTheAddress) {
  DistributedConfig config;
  config.rank = 1;
  config.world_size = 2;
  config.master_port = find_free_port();
  config.timeout = std::chrono::seconds(2);
  const auto start = std::chrono::steady_clock::now();
  try {
    DistributedContext context(config);
    FAIL() << "joined a group without a master";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find("MASTER_ADDR:MASTER_PORT=127.0.0.1:"), std::string::npos) << error.what();
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
}

// ---------------------------------------------------------------------------------------------------------
// Single process and configuration.

TEST(Distributed, SingleProcessContextIsANoOp) {
  DistributedContext context;
  EXPECT_FALSE(context.enabled());
  EXPECT_TRUE(context.is_main());
  EXPECT_EQ(context.world_size(), 1);
  TinyNet net = fresh_net(3);
  torch::mse_loss(net->forward(torch::ones({2, 3, 8, 8})), torch::zeros({2, 5})).backward();
  const torch::Tensor grad = net->conv1->weight.grad().clone();
  context.average_gradients(*net);
  context.broadcast_parameters(*net);
  context.barrier();
  EXPECT_TRUE(torch::equal(net->conv1->weight.grad(), grad));
  EXPECT_TRUE(context.all_reduce_flag(true));
  EXPECT_FALSE(context.all_reduce_flag(false));
  EXPECT_TRUE(torch::equal(context.all_reduce_mean(torch::tensor({1.5f, 2.0f})), torch::tensor({1.5f, 2.0f})));
}

using Env = std::map<std::string, std::string>;

DistributedConfig config_from(const Env& env) {
  return distributed_config_from_env([&env](const char* name) -> const char* {
    auto found = env.find(name);
    return found == env.end() ? nullptr : found->second.c_str();
  });
}

std::string error_of(const Env& env) {
  try {
    config_from(env);
  } catch (const std::invalid_argument& error) {
    return error.what();
  }
  return "no error";
}

TEST(Distributed, SingleProcessStopDecisionIsTheLocalOne) {
  DistributedContext context;
  reset_stop_state();
  EXPECT_EQ(agree_on_stop(context), StopReason::kNone);
  request_stop(StopReason::kTimeLimit);
  EXPECT_EQ(agree_on_stop(context), StopReason::kTimeLimit);
  reset_stop_state();
  EXPECT_EQ(context.all_reduce_max(7), 7);
}

TEST(Distributed, ConfigFromTorchrunEnvironment) {
  const DistributedConfig none = config_from({});
  EXPECT_EQ(none.world_size, 1);
  EXPECT_EQ(none.rank, 0);

  const DistributedConfig config = config_from({{"RANK", "3"},
                                                {"WORLD_SIZE", "4"},
                                                {"LOCAL_RANK", "1"},
                                                {"MASTER_ADDR", "trainer-0.trainer"},
                                                {"MASTER_PORT", "29511"},
                                                {"YOLO8_DIST_TIMEOUT", "42"}});
  EXPECT_EQ(config.rank, 3);
  EXPECT_EQ(config.world_size, 4);
  EXPECT_EQ(config.local_rank, 1);
  EXPECT_EQ(config.master_addr, "trainer-0.trainer");
  EXPECT_EQ(config.master_port, 29511);
  EXPECT_EQ(config.timeout, std::chrono::seconds(42));

  // An indexed Job sets no LOCAL_RANK: one process per pod, so it is the rank.
  const DistributedConfig job =
      config_from({{"RANK", "2"}, {"WORLD_SIZE", "3"}, {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(job.local_rank, 2);
  EXPECT_EQ(config_from({{"WORLD_SIZE", "1"}}).world_size, 1);
}

TEST(Distributed, ConfigErrorsNameTheVariable) {
  const Env base = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29500"}};
  const auto without = [&](const std::string& key) {
    Env env = base;
    env.erase(key);
    return error_of(env);
  };
  const auto with = [&](const std::string& key, const std::string& value) {
    Env env = base;
    env[key] = value;
    return error_of(env);
  };
  EXPECT_EQ(error_of(base), "no error");
  EXPECT_NE(without("MASTER_PORT").find("MASTER_PORT is not set"), std::string::npos);
  EXPECT_NE(without("MASTER_ADDR").find("MASTER_ADDR is not set"), std::string::npos);
  EXPECT_NE(without("RANK").find("RANK is not set"), std::string::npos);
  EXPECT_NE(without("WORLD_SIZE").find("WORLD_SIZE is not set"), std::string::npos);
  EXPECT_NE(with("RANK", "2").find("RANK='2'"), std::string::npos);
  EXPECT_NE(with("RANK", "abc").find("RANK='abc'"), std::string::npos);
  EXPECT_NE(with("WORLD_SIZE", "0").find("WORLD_SIZE='0'"), std::string::npos);
  EXPECT_NE(with("MASTER_PORT", "70000").find("MASTER_PORT='70000'"), std::string::npos);
  EXPECT_NE(with("LOCAL_RANK", "-1").find("LOCAL_RANK='-1'"), std::string::npos);
  EXPECT_NE(with("YOLO8_DIST_TIMEOUT", "0s").find("YOLO8_DIST_TIMEOUT"), std::string::npos);
  EXPECT_NE(with("YOLO8_DIST_BACKEND", "mpi").find("backend"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------------------
// The launcher with shell children.

LaunchOptions shell(const std::string& script) {
  LaunchOptions options;
  options.executable = "/bin/sh";
  options.extra_env = {{"YOLO8_TEST_SCRIPT", script}};
  options.timeout = std::chrono::seconds(60);
  options.failure_grace = std::chrono::seconds(5);
  return options;
}

int run_shell(const std::string& script, int ranks = 2) {
  std::vector<int> devices;
  for (int i = 0; i < ranks; ++i) devices.push_back(i);
  return launch_local_workers(devices, {"-c", "eval \"$YOLO8_TEST_SCRIPT\""}, shell(script));
}

TEST(DistributedLauncher, SetsTheRankEnvironment) {
  EXPECT_EQ(run_shell("test \"$WORLD_SIZE\" = 3 && test \"$LOCAL_RANK\" = \"$RANK\" && "
                      "test \"$MASTER_ADDR\" = 127.0.0.1 && test \"$MASTER_PORT\" -gt 0 || exit 9; "
                      "if [ \"$RANK\" = 2 ]; then exit 11; fi; exit 0",
                      3),
            11);
  EXPECT_EQ(run_shell("test \"$WORLD_SIZE\" = 2 && test \"$MASTER_PORT\" -gt 0"), 0);
}

TEST(DistributedLauncher, CombinesExitCodes) {
  EXPECT_EQ(run_shell("exit 0"), 0);
  EXPECT_EQ(run_shell("if [ \"$RANK\" = 1 ]; then exit 75; fi; exit 0"), 75);
  EXPECT_EQ(run_shell("exit 75"), 75);
  EXPECT_EQ(run_shell("if [ \"$RANK\" = 1 ]; then exit 3; fi; exit 75"), 3);
  EXPECT_EQ(run_shell("kill -9 $$"), 137);
}

TEST(DistributedLauncher, AFailedRankStopsTheOthers) {
  const auto start = std::chrono::steady_clock::now();
  // Rank 0 would wait a minute (as in a collective with a dead peer); the failure of rank 1 ends it.
  EXPECT_EQ(run_shell("if [ \"$RANK\" = 1 ]; then exit 4; fi; trap 'exit 75' TERM; "
                      "i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; exit 0"),
            4);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);
}

TEST(DistributedLauncher, ForwardsSigtermToEveryChild) {
  // Both children exit 75 only when they receive SIGTERM; otherwise they run a minute and exit 1.
  std::thread sender([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    ::kill(::getpid(), SIGTERM);
  });
  const auto start = std::chrono::steady_clock::now();
  const int code = run_shell("trap 'exit 75' TERM; i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; exit 1");
  sender.join();
  EXPECT_EQ(code, 75);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 20.0);
}

TEST(DistributedLauncher, RejectsAnEmptyDeviceList) {
  EXPECT_THROW(launch_local_workers({}, {}), std::invalid_argument);
}

}  // namespace
}  // namespace yolo8
