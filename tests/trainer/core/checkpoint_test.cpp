// Checkpoint round trips (bitwise), the next optimizer step after a restore, validation of bad files.
#include "trainer/core/checkpoint.h"

#include <caffe2/serialize/inline_container.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <type_traits>

#include "models/pickle_reader.h"
#include "tests/trainer/tiny_net.h"
#include "trainer/core/atomic_file.h"
#include "trainer/core/optimizer.h"
#include "trainer/core/rng_state.h"
#include "trainer/core/schedule.h"
#include "trainer/core/train_step.h"

namespace yolo8 {
namespace {

namespace fs = std::filesystem;

bool bitwise_equal(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || !a.sizes().equals(b.sizes())) return false;
  const auto ca = a.contiguous();
  const auto cb = b.contiguous();
  return std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

void expect_modules_bitwise(const torch::nn::Module& a, const torch::nn::Module& b) {
  const auto ta = state_tensors(a);
  const auto tb = state_tensors(b);
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); ++i) {
    EXPECT_EQ(ta[i].first, tb[i].first);
    EXPECT_TRUE(bitwise_equal(ta[i].second, tb[i].second)) << ta[i].first;
  }
}

// The optimizer's state key for a parameter: LibTorch 1.13 uses the TensorImpl address as text, later versions
// may key by pointer.
template <typename Map>
typename Map::key_type state_key(const Map&, const torch::Tensor& p) {
  using Key = typename Map::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << p.unsafeGetTensorImpl();
    return s.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

class CheckpointTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    dir_ = fs::temp_directory_path() / ("yolo8_ckpt_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  fs::path dir_;
};

struct MiniRun {
  test::TinyNet net;
  BuiltOptimizer built;
  std::unique_ptr<ModelEma> ema;
  std::unique_ptr<TrainSchedule> schedule;
  OptimSettings settings;
  RunShape shape{64, 4, 5, 2};

  explicit MiniRun(const std::string& optimizer, int64_t seed) {
    torch::manual_seed(seed);
    net = test::TinyNet();
    settings.optimizer = optimizer;
    settings.warmup_epochs = 1.0;
    built = build_optimizer(*net, settings, shape);
    ema = std::make_unique<ModelEma>(ModelEma::clone_of(net.ptr()));
    schedule = std::make_unique<TrainSchedule>(settings, built.choice, shape.batch, shape.epochs, 16);
  }
  // One training iteration of the recipe on fixed data.
  void iterate(int64_t epoch, int64_t ni) {
    schedule->begin_iteration(*built.optimizer, epoch, ni);
    test::tiny_backward(net, 100 + ni);
    if (schedule->should_step(ni)) {
      built.optimizer->step();
      built.optimizer->zero_grad();
      schedule->record_step(ni);
      ema->update(*net);
    }
  }
};

TEST_P(CheckpointTest, RoundTripIsBitwiseAndNextStepMatches) {
  MiniRun a(GetParam(), 1);
  a.schedule = std::make_unique<TrainSchedule>(a.settings, a.built.choice, 16, a.shape.epochs, 16);  // accumulate 4
  for (int64_t ni = 0; ni < 10; ++ni) a.iterate(0, ni);
  ASSERT_GE(a.schedule->optimizer_steps(), 3);
  ASSERT_FALSE(a.built.optimizer->state().empty());
  // A gradient accumulated and not yet stepped (LibTorch 2.x's zero_grad leaves none after a step, where 1.13 left
  // zeros): the checkpoint must carry it, and both runs add it to their next iteration's.
  test::tiny_backward(a.net, 110);

  CheckpointState st;
  st.epoch = 0;
  st.iteration_in_epoch = 10;
  st.global_iteration = 10;
  st.batch = 16;
  st.schedule = a.schedule->state();
  st.optimizer_choice = a.built.choice;
  st.best_fitness = 0.123456789012345;
  st.has_best_fitness = true;
  st.settings_text = "optimizer: " + GetParam() + "\nlr0: 0.01\n";
  st.rng = capture_torch_rng();
  std::mt19937 mt(42);
  mt.discard(17);
  st.rng.streams["augment"] = engine_state(mt);
  const std::string file = path("last.pt");
  save_checkpoint(file, st, {a.net.get(), a.ema.get(), a.built.optimizer.get(), /*include_grads=*/true});

  MiniRun b(GetParam(), 2);  // other initial weights
  b.schedule = std::make_unique<TrainSchedule>(b.settings, b.built.choice, 16, b.shape.epochs, 16);
  CheckpointTargets targets;
  targets.model = b.net.get();
  targets.ema = b.ema.get();
  targets.optimizer = b.built.optimizer.get();
  const auto got = load_checkpoint(file, targets);
  b.schedule->restore(got.schedule);

  expect_modules_bitwise(*a.net, *b.net);
  expect_modules_bitwise(a.ema->module(), b.ema->module());
  EXPECT_EQ(b.ema->updates(), a.ema->updates());
  EXPECT_EQ(got.epoch, 0);
  EXPECT_EQ(got.iteration_in_epoch, 10);
  EXPECT_EQ(got.global_iteration, 10);
  EXPECT_EQ(got.batch, 16);
  EXPECT_EQ(got.schedule.scheduler_epoch, st.schedule.scheduler_epoch);
  EXPECT_EQ(got.schedule.accumulate, st.schedule.accumulate);
  EXPECT_EQ(got.schedule.last_opt_step, st.schedule.last_opt_step);
  EXPECT_EQ(got.schedule.optimizer_steps, st.schedule.optimizer_steps);
  EXPECT_EQ(got.optimizer_choice.name, GetParam());
  EXPECT_EQ(got.optimizer_choice.lr, a.built.choice.lr);
  EXPECT_EQ(got.optimizer_choice.momentum, a.built.choice.momentum);
  EXPECT_EQ(got.optimizer_choice.warmup_bias_lr, a.built.choice.warmup_bias_lr);
  EXPECT_EQ(got.best_fitness, st.best_fitness);
  EXPECT_TRUE(got.has_best_fitness);
  EXPECT_EQ(got.settings_text, st.settings_text);
  EXPECT_FALSE(got.date.empty());
  EXPECT_FALSE(got.version.empty());
  EXPECT_TRUE(bitwise_equal(got.rng.torch_cpu, st.rng.torch_cpu));
  std::mt19937 mt2;
  set_engine_state(mt2, got.rng.streams.at("augment"));
  EXPECT_EQ(mt2(), mt());

  // Optimizer hyper-parameters and per-parameter state.
  auto& oa = *a.built.optimizer;
  auto& ob = *b.built.optimizer;
  size_t compared = 0;
  for (size_t g = 0; g < 3; ++g) {
    EXPECT_EQ(group_lr(oa, g), group_lr(ob, g));
    EXPECT_EQ(group_momentum(oa, g), group_momentum(ob, g));
    EXPECT_EQ(group_weight_decay(oa, g), group_weight_decay(ob, g));
    const auto& pa = oa.param_groups()[g].params();
    const auto& pb = ob.param_groups()[g].params();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      const auto ka = state_key(oa.state(), pa[i]);
      const auto kb = state_key(ob.state(), pb[i]);
      ASSERT_EQ(oa.state().count(ka), ob.state().count(kb));
      if (!oa.state().count(ka)) continue;
      ++compared;
      if (GetParam() == "SGD") {
        auto& sa = static_cast<torch::optim::SGDParamState&>(*oa.state().at(ka));
        auto& sb = static_cast<torch::optim::SGDParamState&>(*ob.state().at(kb));
        EXPECT_TRUE(bitwise_equal(sa.momentum_buffer(), sb.momentum_buffer()));
      } else if (GetParam() == "Adam") {
        auto& sa = static_cast<torch::optim::AdamParamState&>(*oa.state().at(ka));
        auto& sb = static_cast<torch::optim::AdamParamState&>(*ob.state().at(kb));
        EXPECT_EQ(sa.step(), sb.step());
        EXPECT_TRUE(bitwise_equal(sa.exp_avg(), sb.exp_avg()));
        EXPECT_TRUE(bitwise_equal(sa.exp_avg_sq(), sb.exp_avg_sq()));
      } else {
        auto& sa = static_cast<torch::optim::AdamWParamState&>(*oa.state().at(ka));
        auto& sb = static_cast<torch::optim::AdamWParamState&>(*ob.state().at(kb));
        EXPECT_EQ(sa.step(), sb.step());
        EXPECT_TRUE(bitwise_equal(sa.exp_avg(), sb.exp_avg()));
        EXPECT_TRUE(bitwise_equal(sa.exp_avg_sq(), sb.exp_avg_sq()));
      }
    }
  }
  EXPECT_EQ(compared, a.net->parameters().size());  // every parameter has state after a step
  // Pending (accumulated, not yet stepped) gradients came back too.
  ASSERT_TRUE(a.net->conv->weight.grad().defined());
  EXPECT_TRUE(bitwise_equal(a.net->conv->weight.grad(), b.net->conv->weight.grad()));

  // Continuing both runs gives bitwise-identical weights, EMA and counters.
  for (int64_t ni = 10; ni < 24; ++ni) {
    a.iterate(0, ni);
    b.iterate(0, ni);
  }
  EXPECT_EQ(a.schedule->optimizer_steps(), b.schedule->optimizer_steps());
  EXPECT_GT(a.schedule->optimizer_steps(), st.schedule.optimizer_steps);
  expect_modules_bitwise(*a.net, *b.net);
  expect_modules_bitwise(a.ema->module(), b.ema->module());
}

INSTANTIATE_TEST_SUITE_P(Optimizers, CheckpointTest, ::testing::Values("SGD", "Adam", "AdamW"));

class CheckpointFiles : public CheckpointTest {};

void expect_one_line_error(const std::string& file, const std::string& what_part) {
  try {
    load_checkpoint(file);
    ADD_FAILURE() << "no error for " << file;
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(file), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    EXPECT_NE(msg.find(what_part), std::string::npos) << msg;
  }
}

TEST_F(CheckpointFiles, TruncatedOrCorruptFilesThrowOneLineErrors) {
  MiniRun a("SGD", 1);
  const std::string file = path("last.pt");
  save_checkpoint(file, CheckpointState{}, {a.net.get(), a.ema.get(), a.built.optimizer.get()});
  ASSERT_TRUE(checkpoint_readable(file));
  std::ifstream in(file, std::ios::binary);
  const std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GT(bytes.size(), 1000u);

  auto write = [&](const std::string& name, const std::vector<char>& data) {
    std::ofstream out(path(name), std::ios::binary);
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
    return path(name);
  };
  expect_one_line_error(write("half.pt", std::vector<char>(bytes.begin(), bytes.begin() + bytes.size() / 2)),
                        "truncated or corrupt");
  expect_one_line_error(write("short.pt", std::vector<char>(bytes.begin(), bytes.end() - 1)), "truncated or corrupt");
  expect_one_line_error(write("empty.pt", {}), "empty");
  expect_one_line_error(write("text.pt", std::vector<char>(2000, 'x')), "truncated or corrupt");
  // A flipped byte inside any tensor's data (not in the zip's alignment padding, which holds none).
  const std::string data(bytes.begin(), bytes.end());
  std::istringstream stream(data);
  caffe2::serialize::PyTorchStreamReader zip(&stream);
  size_t flips = 0;
  for (const std::string& record : zip.getAllRecords()) {
    const size_t size = std::get<1>(zip.getRecord(record));
    if (record.rfind("data/", 0) != 0 || size == 0) continue;
    auto flipped = bytes;
    flipped[zip.getRecordOffset(record) + size / 2] ^= 0x5a;
    std::string err;
    EXPECT_FALSE(checkpoint_readable(write("flipped.pt", flipped), &err)) << record;
    EXPECT_NE(err.find("corrupt"), std::string::npos) << record << ": " << err;
    ++flips;
  }
  EXPECT_GE(flips, 3u);  // model, EMA and optimizer tensors
  expect_one_line_error(path("missing.pt"), "cannot open");

  // A valid zip of another kind is refused by its format tag.
  const auto other = torch::pickle_save(c10::IValue(torch::ones({3})));
  expect_one_line_error(write("other.pt", other), "not a dict");
}

// Format 1 (our dict at the top level, torch::pickle_save) still loads: it is the `yolo8` dict of format 2.
TEST_F(CheckpointFiles, FormatOneFilesStillLoad) {
  MiniRun a("SGD", 3);
  for (int64_t ni = 0; ni < 4; ++ni) a.iterate(0, ni);
  CheckpointState st;
  st.epoch = 2;
  st.best_fitness = 0.25;
  st.has_best_fitness = true;
  st.settings_text = "lr0: 0.01\n";
  const std::vector<char> bytes = encode_checkpoint(st, {a.net.get(), a.ema.get(), a.built.optimizer.get()});
  auto own = torch::pickle_load(bytes).toGenericDict().at("yolo8").toGenericDict();
  EXPECT_EQ(own.at("format_version").toInt(), 2);
  own.insert_or_assign("format_version", int64_t{1});
  const std::vector<char> v1 = torch::pickle_save(c10::IValue(own));

  MiniRun b("SGD", 4);
  CheckpointTargets targets;
  targets.model = b.net.get();
  targets.ema = b.ema.get();
  targets.optimizer = b.built.optimizer.get();
  const CheckpointState got = decode_checkpoint(v1, targets, "v1.pt");
  expect_modules_bitwise(*a.net, *b.net);
  expect_modules_bitwise(a.ema->module(), b.ema->module());
  EXPECT_EQ(got.epoch, 2);
  EXPECT_EQ(got.best_fitness, 0.25);
  EXPECT_EQ(got.settings_text, "lr0: 0.01\n");
  own.insert_or_assign("format_version", int64_t{3});
  EXPECT_THROW(decode_checkpoint(torch::pickle_save(c10::IValue(own)), {}, "v3.pt"), std::runtime_error);
}

pickle::ValuePtr read_with_our_reader(const std::vector<char>& bytes) {
  const std::string data(bytes.begin(), bytes.end());
  std::istringstream stream(data);
  caffe2::serialize::PyTorchStreamReader zip(&stream);
  auto [pkl, size] = zip.getRecord("data.pkl");
  return pickle::unpickle(std::string(static_cast<const char*>(pkl.get()), size),
                          [&zip](const std::string& key, c10::ScalarType dtype, int64_t numel) {
                            auto [ptr, n] = zip.getRecord("data/" + key);
                            torch::Tensor t = torch::empty({numel}, torch::TensorOptions().dtype(dtype));
                            std::memcpy(t.data_ptr(), ptr.get(), std::min(n, t.nbytes()));
                            return t;
                          });
}

// The keys Ultralytics' YOLO() reads sit beside our state (tests/peer checks them with the real Ultralytics).
TEST_F(CheckpointFiles, UltralyticsKeysSitBesideOurState) {
  MiniRun a("SGD", 5);
  for (int64_t ni = 0; ni < 4; ++ni) a.iterate(0, ni);
  CheckpointState st;
  st.epoch = 3;
  st.settings_text = "meta";
  CheckpointSources sources{a.net.get(), a.ema.get(), a.built.optimizer.get()};
  sources.ultralytics.model_yaml = "nc: 2\nscale: n\nhead:\n  - [[15, 18, 21], 1, Detect, [nc]]\n";
  sources.ultralytics.names = {"cat", "dog"};
  sources.ultralytics.train_args_yaml = "imgsz: 64\ntask: detect\nquota_token: null\n";
  const std::vector<char> last = encode_checkpoint(st, sources);

  const pickle::ValuePtr root = read_with_our_reader(last);
  for (const char* key : {"model", "ema"}) {
    const pickle::Value* m = root->get(key);
    ASSERT_TRUE(m && m->kind == pickle::Kind::kObject) << key;
    EXPECT_EQ(m->s, "ultralytics.nn.tasks.DetectionModel");
    ASSERT_EQ(m->items.size(), 4u);  // (yaml, ch, nc, verbose)
    EXPECT_EQ(m->items[0]->get("scale")->s, "n");
    EXPECT_EQ(m->items[2]->i, 2);
    ASSERT_TRUE(m->state && m->state->get("names"));
    EXPECT_EQ(m->state->get("names")->dict.at(1).second->s, "dog");
  }
  EXPECT_EQ(root->get("epoch")->i, 2);  // the last finished epoch, as Ultralytics counts
  EXPECT_EQ(root->get("optimizer")->kind, pickle::Kind::kNone);
  EXPECT_EQ(root->get("best_fitness")->kind, pickle::Kind::kNone);
  EXPECT_EQ(root->get("train_args")->get("imgsz")->i, 64);
  EXPECT_EQ(root->get("train_args")->get("quota_token")->kind, pickle::Kind::kNone);
  EXPECT_EQ(root->get("yolo8")->get("format")->s, kCheckpointFormat);

  // Without optimizer state (best.pt): `model` holds the EMA weights and `ema` is None, as Ultralytics ships them.
  sources.optimizer = nullptr;
  const pickle::ValuePtr best = read_with_our_reader(encode_checkpoint(st, sources));
  EXPECT_EQ(best->get("model")->kind, pickle::Kind::kObject);
  EXPECT_EQ(best->get("ema")->kind, pickle::Kind::kNone);

  MiniRun b("SGD", 6);
  CheckpointTargets targets;
  targets.model = b.net.get();
  targets.ema = b.ema.get();
  targets.optimizer = b.built.optimizer.get();
  EXPECT_EQ(decode_checkpoint(last, targets).epoch, 3);
  expect_modules_bitwise(*a.net, *b.net);
  expect_modules_bitwise(a.ema->module(), b.ema->module());
}

// A snapshot is what the run hands to the writer's thread: it must encode to the bytes the objects gave when it
// was taken, however far training has gone on since, and as often as it is encoded.
TEST_F(CheckpointFiles, SnapshotEncodesAsTheStateWasWhenTaken) {
  MiniRun a("AdamW", 11);
  for (int64_t ni = 0; ni < 4; ++ni) a.iterate(0, ni);
  CheckpointState st;
  st.epoch = 1;
  st.settings_text = "meta";
  st.date = "2026-12-02T15:00:00Z";
  st.version = "test";
  st.rng = capture_torch_rng();
  CheckpointSources sources{a.net.get(), a.ema.get(), a.built.optimizer.get()};
  sources.include_grads = true;
  sources.ultralytics.model_yaml = "nc: 2\nscale: n\nhead:\n  - [[15, 18, 21], 1, Detect, [nc]]\n";
  sources.ultralytics.names = {"cat", "dog"};
  sources.ultralytics.train_args_yaml = "imgsz: 64\n";
  a.iterate(0, 4);  // gradients accumulated, not yet stepped
  const std::vector<char> then = encode_checkpoint(st, sources);
  const CheckpointSnapshot snapshot = snapshot_checkpoint(st, sources);
  for (int64_t ni = 5; ni < 12; ++ni) a.iterate(0, ni);  // weights, EMA, moments and gradients all move on
  ASSERT_NE(encode_checkpoint(st, sources), then);
  EXPECT_EQ(encode_snapshot(snapshot), then);
  EXPECT_EQ(encode_snapshot(snapshot), then);
}

// The content checksum is over the values in row-major order: a channels-last weight hashes as its contiguous copy
// did, so files written while the hash still reordered with contiguous() keep loading.
TEST_F(CheckpointFiles, ChecksumIsTheSameInEitherLayout) {
  MiniRun a("SGD", 3);
  CheckpointState st;
  st.date = "2026-12-02T15:00:00Z";
  st.version = "test";
  CheckpointSources sources{a.net.get(), a.ema.get()};
  const auto checksum = [&] {
    const pickle::ValuePtr root = read_with_our_reader(encode_checkpoint(st, sources));
    return root->get("yolo8")->get("checksum")->i;
  };
  const int64_t contiguous = checksum();
  to_channels_last(*a.net);
  to_channels_last(a.ema->module());
  ASSERT_FALSE(a.net->conv->weight.is_contiguous());
  EXPECT_EQ(checksum(), contiguous);
  a.net->conv->weight.data()[0][1][2][0] += 1.0f;  // and it still sees a changed value
  EXPECT_NE(checksum(), contiguous);
}

TEST_F(CheckpointFiles, MismatchesNameWhatDiffers) {
  MiniRun a("SGD", 1);
  const std::string file = path("last.pt");
  save_checkpoint(file, CheckpointState{}, {a.net.get(), nullptr, a.built.optimizer.get()});

  struct Wide : torch::nn::Module {
    Wide() {
      conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 8, 3).bias(false)));
      bn = register_module("bn", torch::nn::BatchNorm2d(8));
      fc = register_module("fc", torch::nn::Linear(8, 2));
    }
    torch::nn::Conv2d conv{nullptr};
    torch::nn::BatchNorm2d bn{nullptr};
    torch::nn::Linear fc{nullptr};
  } wide;
  CheckpointTargets t;
  t.model = &wide;
  try {
    load_checkpoint(file, t);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("'conv.weight'"), std::string::npos) << e.what();
  }
  MiniRun adam("Adam", 1);
  t = {};
  t.optimizer = adam.built.optimizer.get();
  try {
    load_checkpoint(file, t);
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("SGD"), std::string::npos) << e.what();
  }
  t = {};
  t.ema = a.ema.get();
  EXPECT_THROW(load_checkpoint(file, t), std::runtime_error);  // saved without EMA
}

TEST_F(CheckpointFiles, AtomicWriteReplacesAndCleansUp) {
  const std::string file = path("blob.bin");
  const std::string first(1000, 'a');
  const std::string second(10, 'b');
  write_file_atomic(file, first.data(), first.size());
  write_file_atomic(file, second.data(), second.size());
  std::ifstream in(file, std::ios::binary);
  const std::string got((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, second);
  // A stale temporary of a writer that is gone (pid 1 is alive; use our own pid) is removed by the next write.
  const std::string stale = path(".blob.bin.tmp." + std::to_string(::getpid()) + ".99");
  std::ofstream(stale) << "partial";
  write_file_atomic(file, first.data(), first.size());
  EXPECT_FALSE(fs::exists(stale));
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1u);
  EXPECT_THROW(write_file_atomic(path("no/such/dir/x.bin"), "x", 1), std::system_error);
}

TEST(RngState, TorchAndEngineStatesRestore) {
  torch::manual_seed(11);
  const auto saved = capture_torch_rng();
  const auto a = torch::randn({5});
  restore_torch_rng(saved);
  const auto b = torch::randn({5});
  EXPECT_TRUE(torch::equal(a, b));
  std::mt19937_64 e(9);
  const auto text = engine_state(e);
  const auto x = e();
  std::mt19937_64 f;
  set_engine_state(f, text);
  EXPECT_EQ(f(), x);
  EXPECT_THROW(set_engine_state(f, "not a state"), std::invalid_argument);
  RngState bad;
  bad.torch_cpu = torch::zeros({3}, torch::kFloat);
  EXPECT_THROW(restore_torch_rng(bad), std::invalid_argument);
}

}  // namespace
}  // namespace yolo8
