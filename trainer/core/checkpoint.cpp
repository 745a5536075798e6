#include "trainer/core/checkpoint.h"

#include <caffe2/serialize/inline_container.h>
#include <caffe2/serialize/read_adapter_interface.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <optional>
#include <stdexcept>
#include <system_error>

#include "models/pickle_reader.h"
#include "models/pickle_writer.h"
#include "trainer/core/atomic_file.h"

#ifndef YOLO8_VERSION
#define YOLO8_VERSION "unknown"
#endif

namespace yolo8 {
namespace {

using GenericDict = c10::impl::GenericDict;

std::string one_line(const std::exception& e) {
  std::string msg;
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) {
    msg = ce->what_without_backtrace();
  } else {
    msg = e.what();
  }
  const auto nl = msg.find('\n');
  if (nl != std::string::npos) msg.resize(nl);
  return msg;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

GenericDict new_dict() { return GenericDict(c10::StringType::get(), c10::AnyType::get()); }

// Pickling reads CPU bytes in place; only device tensors need a host copy.
// `copy`: the caller may change the tensor afterwards (a snapshot); a CUDA tensor's host copy is one already. The
// layout stays (a channels-last weight too): a resumed gradient must have its parameter's.
torch::Tensor for_saving(const torch::Tensor& t, bool copy) {
  if (!t.device().is_cpu()) return t.detach().cpu();
  return copy ? t.detach().clone() : t.detach();
}

GenericDict tensor_dict(const std::vector<std::pair<std::string, torch::Tensor>>& tensors, bool copy) {
  GenericDict d(c10::StringType::get(), c10::TensorType::get());
  for (const auto& [name, t] : tensors) d.insert(name, for_saving(t, copy));
  return d;
}

std::vector<char> optimizer_bytes(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  std::vector<char> out;
  archive.save_to([&out](const void* data, size_t n) -> size_t {
    const char* p = static_cast<const char*>(data);
    out.insert(out.end(), p, p + n);
    return n;
  });
  return out;
}

std::string optimizer_type(const torch::optim::Optimizer& o) {
  if (dynamic_cast<const torch::optim::SGD*>(&o)) return "SGD";
  if (dynamic_cast<const torch::optim::AdamW*>(&o)) return "AdamW";
  if (dynamic_cast<const torch::optim::Adam*>(&o)) return "Adam";
  if (dynamic_cast<const torch::optim::RMSprop*>(&o)) return "RMSprop";
  if (dynamic_cast<const torch::optim::Adagrad*>(&o)) return "Adagrad";
  return "other";
}

// Reading helpers that name the missing or mistyped key.
struct Reader {
  const GenericDict& dict;
  const std::string& origin;
  std::string where;

  [[noreturn]] void fail(const std::string& what) const {
    throw std::runtime_error("checkpoint " + origin + ": " + where + what);
  }
  bool has(const std::string& key) const { return dict.contains(key); }
  c10::IValue get(const std::string& key) const {
    if (!dict.contains(key)) fail("missing key '" + key + "'");
    return dict.at(key);
  }
  int64_t integer(const std::string& key) const {
    auto v = get(key);
    if (!v.isInt()) fail("key '" + key + "' is not an integer");
    return v.toInt();
  }
  double real(const std::string& key) const {
    auto v = get(key);
    if (!v.isDouble()) fail("key '" + key + "' is not a float");
    return v.toDouble();
  }
  bool boolean(const std::string& key) const {
    auto v = get(key);
    if (!v.isBool()) fail("key '" + key + "' is not a bool");
    return v.toBool();
  }
  std::string text(const std::string& key) const {
    auto v = get(key);
    if (!v.isString()) fail("key '" + key + "' is not a string");
    return v.toStringRef();
  }
  torch::Tensor tensor(const std::string& key) const {
    auto v = get(key);
    if (!v.isTensor()) fail("key '" + key + "' is not a tensor");
    return v.toTensor();
  }
  GenericDict sub(const std::string& key) const {
    auto v = get(key);
    if (!v.isGenericDict()) fail("key '" + key + "' is not a dict");
    return v.toGenericDict();
  }
};

// Copies stored tensors into a module's parameters and buffers; strict about names, shapes and dtypes.
void load_tensors(const GenericDict& stored, const torch::nn::Module& module, const std::string& origin,
                  const std::string& section) {
  const auto targets = state_tensors(module);
  if (stored.size() != targets.size()) {
    throw std::runtime_error("checkpoint " + origin + ": " + section + " holds " + std::to_string(stored.size()) +
                             " tensors, the model has " + std::to_string(targets.size()));
  }
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : targets) {
    if (!stored.contains(name)) {
      throw std::runtime_error("checkpoint " + origin + ": " + section + " lacks tensor '" + name + "'");
    }
    const auto v = stored.at(name);
    if (!v.isTensor())
      throw std::runtime_error("checkpoint " + origin + ": " + section + " '" + name + "' is not a tensor");
    const auto& s = v.toTensor();
    if (!s.sizes().equals(t.sizes()) || s.scalar_type() != t.scalar_type()) {
      throw std::runtime_error("checkpoint " + origin + ": " + section + " '" + name + "' has shape " +
                               c10::str(s.sizes()) + " " + std::string(c10::toString(s.scalar_type())) +
                               ", the model " + c10::str(t.sizes()) + " " + c10::toString(t.scalar_type()));
    }
    auto target = t;
    target.copy_(s);
  }
}

// A CPU tensor's values in row-major order, as contiguous() would lay them out: the last dimension in a loop per
// element type, the others counted as an odometer.
template <typename Element>
void copy_row_major(const torch::Tensor& t, Element* out) {
  const int64_t dims = t.dim();
  const int64_t row = t.size(dims - 1), step = t.stride(dims - 1);
  const auto* base = static_cast<const Element*>(t.data_ptr());
  std::vector<int64_t> index(static_cast<size_t>(dims - 1), 0);
  int64_t offset = 0;  // in elements, of the current row's first value
  for (Element* const end = out + t.numel(); out != end; out += row) {
    for (int64_t i = 0; i < row; ++i) out[i] = base[offset + i * step];
    for (int64_t d = dims - 2; d >= 0; --d) {
      if (++index[d] < t.size(d)) {
        offset += t.stride(d);
        break;
      }
      offset -= (t.size(d) - 1) * t.stride(d);
      index[d] = 0;
    }
  }
}

std::vector<char> row_major_bytes(const torch::Tensor& t) {
  std::vector<char> out(t.nbytes());
  if (t.numel() == 0) return out;
  switch (t.element_size()) {
    case 1: copy_row_major(t, reinterpret_cast<uint8_t*>(out.data())); break;
    case 2: copy_row_major(t, reinterpret_cast<uint16_t*>(out.data())); break;
    case 4: copy_row_major(t, reinterpret_cast<uint32_t*>(out.data())); break;
    case 8: copy_row_major(t, reinterpret_cast<uint64_t*>(out.data())); break;
    default:
      throw std::invalid_argument("checkpoint: no row-major copy for elements of " + std::to_string(t.element_size()) +
                                  " bytes");
  }
  return out;
}

// A 64-bit hash over the stored tensor bytes: a flipped bit inside tensor data would otherwise load silently.
class ContentHash {
 public:
  void add(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
      uint64_t w;
      std::memcpy(&w, p + i, 8);
      mix(w);
    }
    uint64_t tail = 0;
    std::memcpy(&tail, p + i, n - i);
    mix(tail ^ (static_cast<uint64_t>(n) << 56));
  }
  void add(const std::string& s) { add(s.data(), s.size()); }
  // Over the values in row-major order, whatever the layout. No ATen kernel: a snapshot is hashed on the checkpoint
  // writer's thread, where one would start a second OpenMP team beside the training's.
  void add(const torch::Tensor& t) {
    add(std::string(c10::toString(t.scalar_type())) + c10::str(t.sizes()));
    if (t.is_contiguous()) {
      add(t.data_ptr(), t.nbytes());
      return;
    }
    const std::vector<char> bytes = row_major_bytes(t);
    add(bytes.data(), bytes.size());
  }
  void add(const GenericDict& d) {
    for (const auto& e : d) {
      add(e.key().toStringRef());
      add(e.value().toTensor());
    }
  }
  int64_t value() const { return static_cast<int64_t>(h_); }

 private:
  void mix(uint64_t w) {
    h_ ^= w;
    h_ *= 0x100000001b3ULL;
    h_ ^= h_ >> 29;
  }
  uint64_t h_ = 0xcbf29ce484222325ULL;
};

int64_t content_hash(const GenericDict& root) {
  ContentHash h;
  for (const char* key : {"model", "grads", "ema"}) {
    if (root.contains(key)) h.add(root.at(key).toGenericDict());
  }
  if (root.contains("optimizer")) h.add(root.at("optimizer").toTensor());
  return h.value();
}

// LibTorch 1.13 restores optimizer state but not the param-group options; they are stored here instead.
GenericDict group_options(const torch::optim::OptimizerOptions& options) {
  auto d = new_dict();
  d.insert("lr", options.get_lr());
  if (const auto* sgd = dynamic_cast<const torch::optim::SGDOptions*>(&options)) {
    d.insert("momentum", sgd->momentum());
    d.insert("dampening", sgd->dampening());
    d.insert("weight_decay", sgd->weight_decay());
    d.insert("nesterov", sgd->nesterov());
  } else if (const auto* adam = dynamic_cast<const torch::optim::AdamOptions*>(&options)) {
    d.insert("beta1", std::get<0>(adam->betas()));
    d.insert("beta2", std::get<1>(adam->betas()));
    d.insert("eps", adam->eps());
    d.insert("weight_decay", adam->weight_decay());
    d.insert("amsgrad", adam->amsgrad());
  } else if (const auto* adamw = dynamic_cast<const torch::optim::AdamWOptions*>(&options)) {
    d.insert("beta1", std::get<0>(adamw->betas()));
    d.insert("beta2", std::get<1>(adamw->betas()));
    d.insert("eps", adamw->eps());
    d.insert("weight_decay", adamw->weight_decay());
    d.insert("amsgrad", adamw->amsgrad());
  }
  return d;
}

void apply_group_options(const Reader& r, torch::optim::OptimizerOptions& options) {
  options.set_lr(r.real("lr"));
  if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) {
    sgd->momentum(r.real("momentum")).dampening(r.real("dampening")).weight_decay(r.real("weight_decay"));
    sgd->nesterov(r.boolean("nesterov"));
  } else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) {
    adam->betas({r.real("beta1"), r.real("beta2")}).eps(r.real("eps")).weight_decay(r.real("weight_decay"));
    adam->amsgrad(r.boolean("amsgrad"));
  } else if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
    adamw->betas({r.real("beta1"), r.real("beta2")}).eps(r.real("eps")).weight_decay(r.real("weight_decay"));
    adamw->amsgrad(r.boolean("amsgrad"));
  }
}

// Ultralytics' model object, rebuilt by the loader: DetectionModel(yaml, 3, nc, False), `names` set by BUILD, then
// Module.load_state_dict(model, <our tensor dict>) whose result is dropped. The model stays on the stack.
void write_ultralytics_model(pickle::Writer& w, const UltralyticsView& view, const YAML::Node& yaml,
                             pickle::Writer::MemoId weights) {
  w.global("ultralytics.nn.tasks", "DetectionModel");
  w.mark();
  pickle::write_yaml(w, yaml);
  w.integer(3);  // input channels
  w.integer(yaml["nc"].as<int64_t>());
  w.boolean(false);  // verbose
  w.tuple();
  w.reduce();
  w.empty_dict();
  w.string("names");
  w.empty_dict();
  for (size_t k = 0; k < view.names.size(); ++k) {
    w.integer(static_cast<int64_t>(k));
    w.string(view.names[k]);
    w.set_item();
  }
  w.set_item();
  w.build();
  const auto model = w.memoize();
  // getattr(torch.nn.Module, 'load_state_dict'): protocol 2 has no dotted global names.
  w.global("builtins", "getattr");
  w.global("torch.nn.modules.module", "Module");
  w.string("load_state_dict");
  w.tuple(2);
  w.reduce();
  w.get(model);
  w.get(weights);
  w.tuple(2);
  w.reduce();
  w.pop();
}

YAML::Node parse_yaml(const std::string& text, const char* what) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw std::invalid_argument(std::string("encode_checkpoint: ") + what + " is not YAML: " + e.what());
  }
}

// The file: our state under `yolo8`, then the keys Ultralytics reads (see checkpoint.h).
std::vector<char> write_archive(const GenericDict& root, const CheckpointState& state, const UltralyticsView& view) {
  pickle::Writer w;
  w.empty_dict();
  w.string("yolo8");
  w.empty_dict();
  std::optional<pickle::Writer::MemoId> model_memo, ema_memo;
  for (const auto& e : root) {
    w.string(e.key().toStringRef());
    pickle::write_ivalue(w, e.value());
    if (e.key().toStringRef() == "model") model_memo = w.memoize();
    if (e.key().toStringRef() == "ema") ema_memo = w.memoize();
    w.set_item();
  }
  w.set_item();

  if (!view.model_yaml.empty()) {
    const YAML::Node yaml = parse_yaml(view.model_yaml, "the model yaml");
    if (!yaml.IsMap() || !yaml["nc"]) throw std::invalid_argument("encode_checkpoint: the model yaml has no nc");
    // As Ultralytics' final best.pt: without optimizer state `model` holds the EMA weights and `ema` is None.
    const bool training_file = root.contains("optimizer");
    w.string("model");
    write_ultralytics_model(w, view, yaml, (training_file || !ema_memo) ? *model_memo : *ema_memo);
    w.set_item();
    w.string("ema");
    if (training_file && ema_memo) {
      write_ultralytics_model(w, view, yaml, *ema_memo);
    } else {
      w.none();
    }
    w.set_item();
    w.string("updates");
    if (root.contains("ema_updates")) {
      w.integer(root.at("ema_updates").toInt());
    } else {
      w.none();
    }
    w.set_item();
    w.string("epoch");
    w.integer(state.epoch - 1);  // Ultralytics stores the last finished epoch; ours is the one in progress
    w.set_item();
    w.string("best_fitness");
    if (state.has_best_fitness) {
      w.real(state.best_fitness);
    } else {
      w.none();
    }
    w.set_item();
    w.string("optimizer");
    w.none();  // ours is under yolo8; Ultralytics' resume needs its own optimizer's state_dict
    w.set_item();
    w.string("train_args");
    const YAML::Node args = parse_yaml(view.train_args_yaml, "train_args");
    if (args.IsMap()) {
      pickle::write_yaml(w, args);
    } else {
      w.empty_dict();
    }
    w.set_item();
    for (const char* key : {"date", "version"}) {
      w.string(key);
      w.string(root.at(key).toStringRef());
      w.set_item();
    }
  }
  const auto storages = w.storages();
  return pickle::save_archive(w.finish(), storages);
}

// Reads the zip from memory without a copy.
class BytesAdapter : public caffe2::serialize::ReadAdapterInterface {
 public:
  explicit BytesAdapter(const std::vector<char>& bytes) : bytes_(bytes) {}
  size_t size() const override { return bytes_.size(); }
  size_t read(uint64_t pos, void* buf, size_t n, const char* /*what*/) const override {
    if (pos >= bytes_.size()) return 0;
    n = std::min<size_t>(n, bytes_.size() - pos);
    std::memcpy(buf, bytes_.data() + pos, n);
    return n;
  }

 private:
  const std::vector<char>& bytes_;
};

c10::IValue to_ivalue(const pickle::Value& v) {
  switch (v.kind) {
    case pickle::Kind::kNone: return {};
    case pickle::Kind::kBool: return v.b;
    case pickle::Kind::kInt: return v.i;
    case pickle::Kind::kFloat: return v.f;
    case pickle::Kind::kString: return v.s;
    case pickle::Kind::kTensor: return v.tensor;
    case pickle::Kind::kDict: {
      auto d = new_dict();
      for (const auto& [k, item] : v.dict) {
        if (!k || k->kind != pickle::Kind::kString || !item) throw std::runtime_error("a dict key is not a string");
        d.insert_or_assign(k->s, to_ivalue(*item));
      }
      return d;
    }
    case pickle::Kind::kList:
    case pickle::Kind::kTuple: {
      c10::impl::GenericList l(c10::AnyType::get());
      for (const auto& item : v.items) {
        if (!item) throw std::runtime_error("an empty list item");
        l.push_back(to_ivalue(*item));
      }
      return l;
    }
    default: throw std::runtime_error("unexpected " + v.s + " in the yolo8 state");
  }
}

// Format 2: the `yolo8` dict through our own reader (the Ultralytics objects beside it are only walked). nullopt
// for anything else, which then goes to torch::pickle_load as format 1 did.
std::optional<c10::IValue> read_own_state(const std::vector<char>& bytes, const std::string& origin) {
  pickle::ValuePtr root;
  try {
    caffe2::serialize::PyTorchStreamReader zip(std::make_shared<BytesAdapter>(bytes));
    auto [pkl_ptr, pkl_size] = zip.getRecord("data.pkl");
    const std::string pkl(static_cast<const char*>(pkl_ptr.get()), pkl_size);
    const pickle::StorageLoader loader = [&zip](const std::string& key, c10::ScalarType dtype, int64_t numel) {
      auto [ptr, size] = zip.getRecord("data/" + key);
      const size_t need = static_cast<size_t>(numel) * c10::elementSize(dtype);
      if (size < need) throw std::runtime_error("storage record '" + key + "' is shorter than its tensor");
      torch::Tensor t = torch::empty({numel}, torch::TensorOptions().dtype(dtype));
      if (need) std::memcpy(t.data_ptr(), ptr.get(), need);
      return t;
    };
    root = pickle::unpickle(pkl, loader);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  const pickle::Value* own = root ? root->get("yolo8") : nullptr;
  if (own == nullptr) return std::nullopt;
  try {
    if (own->kind != pickle::Kind::kDict) throw std::runtime_error("'yolo8' is not a dict");
    return to_ivalue(*own);
  } catch (const std::exception& e) {
    throw std::runtime_error("checkpoint " + origin + ": unreadable (truncated or corrupt): " + one_line(e));
  }
}

// The `yolo8` dict without its checksum; `copy` detaches it from the training objects (see snapshot_checkpoint).
GenericDict yolo8_dict_of(const CheckpointState& state, const CheckpointSources& sources, bool copy) {
  if (sources.model == nullptr) throw std::invalid_argument("encode_checkpoint: a model is required");
  auto root = new_dict();
  root.insert("format", std::string(kCheckpointFormat));
  root.insert("format_version", kCheckpointFormatVersion);
  root.insert("date", state.date.empty() ? utc_now() : state.date);
  root.insert("version", state.version.empty() ? std::string(YOLO8_VERSION) : state.version);
  root.insert("settings", state.settings_text);

  auto counters = new_dict();
  counters.insert("epoch", state.epoch);
  counters.insert("iteration_in_epoch", state.iteration_in_epoch);
  counters.insert("global_iteration", state.global_iteration);
  counters.insert("batch", state.batch);
  counters.insert("scheduler_epoch", state.schedule.scheduler_epoch);
  counters.insert("accumulate", state.schedule.accumulate);
  counters.insert("last_opt_step", state.schedule.last_opt_step);
  counters.insert("optimizer_steps", state.schedule.optimizer_steps);
  counters.insert("best_fitness", state.best_fitness);
  counters.insert("has_best_fitness", state.has_best_fitness);
  root.insert("state", counters);

  auto choice = new_dict();
  choice.insert("name", state.optimizer_choice.name);
  choice.insert("lr", state.optimizer_choice.lr);
  choice.insert("momentum", state.optimizer_choice.momentum);
  choice.insert("warmup_bias_lr", state.optimizer_choice.warmup_bias_lr);
  root.insert("optimizer_choice", choice);

  if (state.has_grad_scaler) {
    auto scaler = new_dict();
    scaler.insert("scale", state.grad_scaler.scale);
    scaler.insert("growth_tracker", state.grad_scaler.growth_tracker);
    root.insert("grad_scaler", scaler);
  }

  root.insert("model", tensor_dict(state_tensors(*sources.model), copy));
  if (sources.include_grads) {
    std::vector<std::pair<std::string, torch::Tensor>> grads;
    for (const auto& p : sources.model->named_parameters(true)) {
      if (p.value().grad().defined()) grads.emplace_back(p.key(), p.value().grad());
    }
    root.insert("grads", tensor_dict(grads, copy));
  }
  if (sources.ema != nullptr) {
    root.insert("ema", tensor_dict(state_tensors(sources.ema->module()), copy));
    root.insert("ema_updates", sources.ema->updates());
  }
  if (sources.optimizer != nullptr) {
    const auto bytes = optimizer_bytes(*sources.optimizer);
    auto t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
    std::memcpy(t.data_ptr(), bytes.data(), bytes.size());
    root.insert("optimizer", t);
    root.insert("optimizer_type", optimizer_type(*sources.optimizer));
    c10::impl::GenericList groups(c10::AnyType::get());
    for (const auto& g : sources.optimizer->param_groups()) groups.push_back(group_options(g.options()));
    root.insert("optimizer_groups", groups);
  }

  if (state.rng.torch_cpu.defined()) {
    root.insert("rng_torch_cpu", state.rng.torch_cpu.cpu());
  } else {
    root.insert("rng_torch_cpu", c10::IValue());
  }
  c10::List<torch::Tensor> cuda;
  for (const auto& t : state.rng.torch_cuda) cuda.push_back(t.cpu());
  root.insert("rng_torch_cuda", cuda);
  c10::Dict<std::string, std::string> streams;
  for (const auto& [k, v] : state.rng.streams) streams.insert(k, v);
  root.insert("rng_streams", streams);
  return root;
}

std::vector<char> encode_root(GenericDict root, const CheckpointState& state, const UltralyticsView& view) {
  root.insert("checksum", content_hash(root));
  return write_archive(root, state, view);
}

}  // namespace

std::vector<char> encode_checkpoint(const CheckpointState& state, const CheckpointSources& sources) {
  return encode_root(yolo8_dict_of(state, sources, /*copy=*/false), state, sources.ultralytics);
}

CheckpointSnapshot snapshot_checkpoint(const CheckpointState& state, const CheckpointSources& sources) {
  CheckpointSnapshot snapshot;
  snapshot.state = state;
  snapshot.root = yolo8_dict_of(state, sources, /*copy=*/true);
  snapshot.ultralytics = sources.ultralytics;
  return snapshot;
}

// A copy of the dict: encoding adds the checksum, and the snapshot may be encoded again.
std::vector<char> encode_snapshot(const CheckpointSnapshot& snapshot) {
  return encode_root(snapshot.root.copy(), snapshot.state, snapshot.ultralytics);
}

CheckpointState decode_checkpoint(const std::vector<char>& bytes, const CheckpointTargets& targets,
                                  const std::string& origin) {
  if (bytes.empty()) throw std::runtime_error("checkpoint " + origin + ": empty file");
  c10::IValue value;
  if (auto own = read_own_state(bytes, origin)) {
    value = std::move(*own);
  } else {
    try {
      value = torch::pickle_load(bytes);  // format 1
    } catch (const std::exception& e) {
      throw std::runtime_error("checkpoint " + origin + ": unreadable (truncated or corrupt): " + one_line(e));
    }
  }
  if (!value.isGenericDict()) throw std::runtime_error("checkpoint " + origin + ": not a dict at the top level");
  const GenericDict root = value.toGenericDict();
  Reader r{root, origin, ""};
  if (!r.has("format") || !r.get("format").isString() || r.text("format") != kCheckpointFormat) {
    throw std::runtime_error("checkpoint " + origin + ": not a yolo8 training checkpoint (no format '" +
                             kCheckpointFormat + "')");
  }
  const int64_t version = r.integer("format_version");
  if (version != 1 && version != kCheckpointFormatVersion) {
    throw std::runtime_error("checkpoint " + origin + ": format version " + std::to_string(version) +
                             " is not supported (expected 1 to " + std::to_string(kCheckpointFormatVersion) + ")");
  }

  for (const char* key : {"model", "grads", "ema"}) {
    if (!r.has(key)) continue;
    for (const auto& e : r.sub(key)) {
      if (!e.key().isString() || !e.value().isTensor()) r.fail(std::string("section '") + key + "' holds a non-tensor");
    }
  }
  if (r.has("optimizer")) r.tensor("optimizer");
  if (content_hash(root) != r.integer("checksum")) r.fail("content checksum mismatch (corrupt file)");

  CheckpointState s;
  s.date = r.text("date");
  s.version = r.text("version");
  s.settings_text = r.text("settings");
  {
    const GenericDict c = r.sub("state");
    Reader cr{c, origin, "state: "};
    s.epoch = cr.integer("epoch");
    s.iteration_in_epoch = cr.integer("iteration_in_epoch");
    s.global_iteration = cr.integer("global_iteration");
    s.batch = cr.integer("batch");
    s.schedule.scheduler_epoch = cr.integer("scheduler_epoch");
    s.schedule.accumulate = cr.integer("accumulate");
    s.schedule.last_opt_step = cr.integer("last_opt_step");
    s.schedule.optimizer_steps = cr.integer("optimizer_steps");
    s.best_fitness = cr.real("best_fitness");
    s.has_best_fitness = cr.boolean("has_best_fitness");
    if (s.epoch < 0 || s.iteration_in_epoch < 0 || s.global_iteration < 0 || s.schedule.accumulate < 1 ||
        s.schedule.optimizer_steps < 0) {
      throw std::runtime_error("checkpoint " + origin + ": state counters are out of range");
    }
  }
  {
    const GenericDict c = r.sub("optimizer_choice");
    Reader cr{c, origin, "optimizer_choice: "};
    s.optimizer_choice.name = cr.text("name");
    s.optimizer_choice.lr = cr.real("lr");
    s.optimizer_choice.momentum = cr.real("momentum");
    s.optimizer_choice.warmup_bias_lr = cr.real("warmup_bias_lr");
  }
  if (r.has("grad_scaler")) {
    const GenericDict c = r.sub("grad_scaler");
    Reader cr{c, origin, "grad_scaler: "};
    s.has_grad_scaler = true;
    s.grad_scaler.scale = cr.real("scale");
    s.grad_scaler.growth_tracker = cr.integer("growth_tracker");
    if (!(s.grad_scaler.scale > 0) || !std::isfinite(s.grad_scaler.scale) || s.grad_scaler.growth_tracker < 0) {
      throw std::runtime_error("checkpoint " + origin + ": grad_scaler state is out of range");
    }
  }
  {
    const auto cpu = r.get("rng_torch_cpu");
    if (cpu.isTensor()) s.rng.torch_cpu = cpu.toTensor();
    const auto cuda = r.get("rng_torch_cuda");
    if (!cuda.isList()) r.fail("key 'rng_torch_cuda' is not a list");
    for (const auto& t : cuda.toListRef()) {
      if (!t.isTensor()) r.fail("key 'rng_torch_cuda' holds a non-tensor");
      s.rng.torch_cuda.push_back(t.toTensor());
    }
    for (const auto& e : r.sub("rng_streams")) {
      if (!e.key().isString() || !e.value().isString()) r.fail("key 'rng_streams' holds a non-string");
      s.rng.streams[e.key().toStringRef()] = e.value().toStringRef();
    }
  }

  const GenericDict model = r.sub("model");
  if (targets.model != nullptr) {
    load_tensors(model, *targets.model, origin, "model");
    if (targets.load_grads && r.has("grads")) {
      const GenericDict grads = r.sub("grads");
      for (const auto& p : targets.model->named_parameters(true)) {
        auto param = p.value();
        if (!grads.contains(p.key())) {
          param.mutable_grad() = torch::Tensor();
          continue;
        }
        const auto g = grads.at(p.key());
        if (!g.isTensor() || !g.toTensor().sizes().equals(param.sizes())) {
          throw std::runtime_error("checkpoint " + origin + ": gradient '" + p.key() + "' does not fit the model");
        }
        param.mutable_grad() = g.toTensor().to(param.device()).clone();
      }
    }
  }
  if (targets.ema != nullptr) {
    if (!r.has("ema")) r.fail("no EMA stored");
    load_tensors(r.sub("ema"), targets.ema->module(), origin, "ema");
    targets.ema->set_updates(r.integer("ema_updates"));
  }
  if (targets.optimizer != nullptr) {
    if (!r.has("optimizer")) r.fail("no optimizer state stored");
    const std::string type = r.text("optimizer_type");
    if (type != optimizer_type(*targets.optimizer)) {
      r.fail("optimizer is " + type + " but the run builds " + optimizer_type(*targets.optimizer));
    }
    const auto t = r.tensor("optimizer").contiguous();
    try {
      torch::serialize::InputArchive archive;
      archive.load_from(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()), targets.device);
      targets.optimizer->load(archive);
    } catch (const std::exception& e) {
      r.fail("optimizer state does not fit: " + one_line(e));
    }
    const auto groups = r.get("optimizer_groups");
    if (!groups.isList() || groups.toListRef().size() != targets.optimizer->param_groups().size()) {
      r.fail("optimizer_groups does not match the optimizer's " +
             std::to_string(targets.optimizer->param_groups().size()) + " param groups");
    }
    for (size_t i = 0; i < groups.toListRef().size(); ++i) {
      const auto& g = groups.toListRef()[i];
      if (!g.isGenericDict()) r.fail("optimizer_groups holds a non-dict");
      const GenericDict gd = g.toGenericDict();
      apply_group_options(Reader{gd, origin, "optimizer group " + std::to_string(i) + ": "},
                          targets.optimizer->param_groups()[i].options());
    }
  }
  return s;
}

void save_checkpoint(const std::string& path, const CheckpointState& state, const CheckpointSources& sources) {
  const auto bytes = encode_checkpoint(state, sources);
  write_file_atomic(path, bytes.data(), bytes.size());
}

CheckpointState load_checkpoint(const std::string& path, const CheckpointTargets& targets) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw std::runtime_error("checkpoint " + path + ": cannot open (" + std::strerror(errno) + ")");
  const auto size = static_cast<std::streamoff>(in.tellg());
  std::vector<char> bytes(static_cast<size_t>(size));
  in.seekg(0);
  if (size > 0 && !in.read(bytes.data(), size)) throw std::runtime_error("checkpoint " + path + ": read error");
  return decode_checkpoint(bytes, targets, path);
}

bool checkpoint_readable(const std::string& path, std::string* error) {
  try {
    load_checkpoint(path, {});
    return true;
  } catch (const std::exception& e) {
    if (error != nullptr) *error = e.what();
    return false;
  }
}

}  // namespace yolo8
