#include "models/weights.h"

#include <caffe2/serialize/inline_container.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <set>
#include <sstream>
#include <stdexcept>

#include "models/pickle_reader.h"

namespace yolo8 {
namespace fs = std::filesystem;
using pickle::Kind;
using pickle::Value;

namespace {

constexpr int kMaxDepth = 64;

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  std::replace(s.begin(), s.end(), '\r', ' ');
  return s;
}

std::string error_text(const std::exception& e) {
  if (const auto* ce = dynamic_cast<const c10::Error*>(&e)) return one_line(ce->what_without_backtrace());
  return one_line(e.what());
}

std::string read_file(const std::string& path) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) throw std::runtime_error(path + ": no such file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void collect_modules(const Value& obj, const std::string& prefix, std::map<std::string, torch::Tensor>& out,
                     int depth) {
  if (depth > kMaxDepth) throw std::runtime_error("module tree nested too deeply");
  if (obj.kind != Kind::kObject || !obj.state || obj.state->kind != Kind::kDict) {
    throw std::runtime_error("module '" + prefix + "' is not a torch.nn.Module object");
  }
  const Value& st = *obj.state;
  std::set<std::string> non_persistent;
  if (const Value* np = st.get("_non_persistent_buffers_set"); np && np->kind == Kind::kList) {
    for (const auto& v : np->items) {
      if (v && v->kind == Kind::kString) non_persistent.insert(v->s);
    }
  }
  for (const char* group : {"_parameters", "_buffers"}) {
    const Value* g = st.get(group);
    if (!g) continue;
    if (g->kind != Kind::kDict) throw std::runtime_error("module '" + prefix + "': " + group + " is not a dict");
    for (const auto& [k, v] : g->dict) {
      if (!k || k->kind != Kind::kString) throw std::runtime_error("module '" + prefix + "': non-string tensor name");
      if (!v || v->is_none() || non_persistent.count(k->s)) continue;
      if (v->kind != Kind::kTensor) throw std::runtime_error("'" + prefix + k->s + "' is not a tensor");
      torch::Tensor t = v->tensor;
      if (t.is_floating_point()) t = t.to(torch::kFloat);
      out[prefix + k->s] = t;
    }
  }
  if (const Value* mods = st.get("_modules")) {
    if (mods->kind != Kind::kDict) throw std::runtime_error("module '" + prefix + "': _modules is not a dict");
    for (const auto& [k, v] : mods->dict) {
      if (!k || k->kind != Kind::kString) throw std::runtime_error("module '" + prefix + "': non-string child name");
      if (!v || v->is_none()) continue;
      collect_modules(*v, prefix + k->s + ".", out, depth + 1);
    }
  }
}

std::string scalar_text(const Value& v) {
  switch (v.kind) {
    case Kind::kInt: return std::to_string(v.i);
    case Kind::kBool: return v.b ? "true" : "false";
    case Kind::kFloat: {
      for (int prec = 6; prec <= 17; ++prec) {  // shortest text that reads back as the same double
        std::ostringstream os;
        os << std::setprecision(prec) << v.f;
        if (std::strtod(os.str().c_str(), nullptr) == v.f) return os.str();
      }
      return std::to_string(v.f);
    }
    case Kind::kString: return v.s;
    default: throw std::runtime_error("architecture dict holds an unsupported value");
  }
}

YAML::Node to_yaml(const Value& v, int depth) {
  if (depth > kMaxDepth) throw std::runtime_error("architecture dict nested too deeply");
  switch (v.kind) {
    case Kind::kNone: return YAML::Node(YAML::NodeType::Null);
    case Kind::kList:
    case Kind::kTuple: {
      YAML::Node n(YAML::NodeType::Sequence);
      for (const auto& it : v.items) n.push_back(to_yaml(*it, depth + 1));
      return n;
    }
    case Kind::kDict: {
      YAML::Node n(YAML::NodeType::Map);
      for (const auto& [k, val] : v.dict) n[scalar_text(*k)] = to_yaml(*val, depth + 1);
      return n;
    }
    default: return YAML::Node(scalar_text(v));
  }
}

std::vector<std::string> names_from(const Value* v) {
  std::vector<std::string> names;
  if (!v) return names;
  if (v->kind == Kind::kList || v->kind == Kind::kTuple) {
    for (const auto& it : v->items) names.push_back(it && it->kind == Kind::kString ? it->s : std::string());
  } else if (v->kind == Kind::kDict) {
    std::map<int64_t, std::string> by_index;
    for (const auto& [k, val] : v->dict) {
      if (k && k->kind == Kind::kInt && val && val->kind == Kind::kString && k->i >= 0 && k->i < 100000) {
        by_index[k->i] = val->s;
      }
    }
    for (const auto& [i, n] : by_index) {
      if (i >= static_cast<int64_t>(names.size())) names.resize(static_cast<size_t>(i) + 1);
      names[static_cast<size_t>(i)] = n;
    }
  }
  return names;
}

void fill_names(std::vector<std::string>& names, int64_t nc) {
  names.resize(static_cast<size_t>(nc));
  for (int64_t i = 0; i < nc; ++i) {
    if (names[static_cast<size_t>(i)].empty()) names[static_cast<size_t>(i)] = "class" + std::to_string(i);
  }
}

// Copies the tensors whose name and shape match; returns how many.
size_t load_matching(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& tensors) {
  torch::NoGradGuard no_grad;
  size_t n = 0;
  for (auto& [name, dst] : state_dict(module)) {
    auto it = tensors.find(name);
    if (it == tensors.end() || it->second.sizes() != dst.sizes()) continue;
    dst.copy_(it->second.to(dst.device(), dst.scalar_type()));
    ++n;
  }
  return n;
}

// Zip (PyTorch layout) + data.pkl through the own unpickler: no Python, no torch::jit, hostile input refused.
pickle::ValuePtr read_pt_archive(const std::string& bytes) {
  std::istringstream stream(bytes);
  caffe2::serialize::PyTorchStreamReader zip(&stream);
  auto [pkl_ptr, pkl_size] = zip.getRecord("data.pkl");
  const std::string pkl(static_cast<const char*>(pkl_ptr.get()), pkl_size);
  pickle::StorageLoader loader = [&zip](const std::string& key, c10::ScalarType dtype, int64_t numel) {
    const std::string record = "data/" + key;
    if (!zip.hasRecord(record)) throw std::runtime_error("missing storage record '" + record + "'");
    auto [ptr, size] = zip.getRecord(record);
    const size_t need = static_cast<size_t>(numel) * c10::elementSize(dtype);
    if (size < need) throw std::runtime_error("storage record '" + record + "' is shorter than its tensor");
    torch::Tensor t = torch::empty({numel}, torch::TensorOptions().dtype(dtype));
    if (need) std::memcpy(t.data_ptr(), ptr.get(), need);
    return t;
  };
  return pickle::unpickle(pkl, loader);
}

bool is_checkpoint(const Value& root) {
  for (const char* key : {"ema", "model"}) {
    if (const Value* v = root.get(key); v && v->kind == Kind::kObject) return true;
  }
  return false;
}

UltralyticsCheckpoint checkpoint_from(const Value& root) {
  UltralyticsCheckpoint ck;
  if (root.kind != Kind::kDict) throw std::runtime_error("not an Ultralytics checkpoint (top level is not a dict)");
  const Value* model = root.get("ema");
  ck.from_ema = model && !model->is_none();
  if (!ck.from_ema) model = root.get("model");
  if (!model || model->is_none()) throw std::runtime_error("not an Ultralytics checkpoint (no 'model' entry)");
  if (model->kind != Kind::kObject) throw std::runtime_error("'model' entry is not a model object");
  ck.model_class = model->class_name();
  if (ck.model_class != "DetectionModel") {
    throw std::runtime_error("holds a " + ck.model_class + ", not a YOLOv8 detection model");
  }
  if (!model->state || model->state->kind != Kind::kDict) throw std::runtime_error("model object has no state");
  const Value& st = *model->state;

  // The head decides the task: Segment, Pose, OBB... derive from Detect but are other models.
  const Value* mods = st.get("_modules");
  const Value* seq = mods ? mods->get("model") : nullptr;
  const Value* seq_mods = seq && seq->state ? seq->state->get("_modules") : nullptr;
  if (!seq_mods || seq_mods->kind != Kind::kDict || seq_mods->dict.empty() || !seq_mods->dict.back().second) {
    throw std::runtime_error("model has no layer list");
  }
  const Value& head = *seq_mods->dict.back().second;
  if (head.kind != Kind::kObject || head.class_name() != "Detect") {
    throw std::runtime_error("head is " + (head.kind == Kind::kObject ? head.class_name() : std::string("unknown")) +
                             ", not a YOLOv8 Detect head");
  }

  collect_modules(*model, "", ck.weights, 0);
  if (ck.weights.empty()) throw std::runtime_error("model holds no weights");

  const Value* yaml = st.get("yaml");
  if (!yaml || yaml->kind != Kind::kDict) throw std::runtime_error("model carries no architecture ('yaml') dict");
  ck.yaml = to_yaml(*yaml, 0);
  if (const Value* nc = yaml->get("nc"); nc && nc->kind == Kind::kInt) ck.nc = nc->i;
  if (ck.nc <= 0 && head.state) {
    if (const Value* nc = head.state->get("nc"); nc && nc->kind == Kind::kInt) ck.nc = nc->i;
  }
  if (ck.nc <= 0 || ck.nc > 100000) throw std::runtime_error("invalid class count");
  ck.names = names_from(st.get("names"));
  fill_names(ck.names, ck.nc);
  return ck;
}

// {name: tensor} from a plain dict (optionally under a 'state_dict' key); non-tensor entries are skipped.
std::map<std::string, torch::Tensor> tensors_from(const Value& dict) {
  std::map<std::string, torch::Tensor> out;
  for (const auto& [k, v] : dict.dict) {
    if (k && k->kind == Kind::kString && v && v->kind == Kind::kTensor) {
      out[k->s] = v->tensor.is_floating_point() ? v->tensor.to(torch::kFloat) : v->tensor;
    }
  }
  return out;
}

}  // namespace

NamedTensors state_dict(const torch::nn::Module& module) {
  NamedTensors out;
  std::function<void(const torch::nn::Module&, const std::string&)> walk = [&](const torch::nn::Module& m,
                                                                               const std::string& prefix) {
    for (const auto& p : m.named_parameters(false)) out.emplace_back(prefix + p.key(), p.value());
    for (const auto& b : m.named_buffers(false)) out.emplace_back(prefix + b.key(), b.value());
    for (const auto& c : m.named_children()) walk(*c.value(), prefix + c.key() + ".");
  };
  walk(module, "");
  return out;
}

void load_state_dict(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& tensors,
                     const std::string& source) {
  torch::NoGradGuard no_grad;
  const NamedTensors own = state_dict(module);
  std::set<std::string> seen;
  for (const auto& [name, dst] : own) {
    auto it = tensors.find(name);
    if (it == tensors.end()) throw std::runtime_error(source + ": missing weight '" + name + "'");
    if (it->second.sizes() != dst.sizes()) {
      std::ostringstream os;
      os << source << ": weight '" << name << "' has shape " << it->second.sizes() << ", the model expects "
         << dst.sizes();
      throw std::runtime_error(os.str());
    }
    seen.insert(name);
  }
  for (const auto& [name, t] : tensors) {
    if (!seen.count(name))
      throw std::runtime_error(source + ": unexpected weight '" + name + "' (architecture mismatch)");
  }
  for (const auto& [name, dst] : own) {
    torch::Tensor d = dst;
    d.copy_(tensors.at(name).to(dst.device(), dst.scalar_type()));
  }
}

UltralyticsCheckpoint read_ultralytics_checkpoint_bytes(const std::string& bytes, const std::string& source) {
  try {
    const pickle::ValuePtr root = read_pt_archive(bytes);
    return checkpoint_from(*root);
  } catch (const std::exception& e) {
    throw std::runtime_error(source + ": cannot read as an Ultralytics YOLOv8 checkpoint: " + error_text(e));
  }
}

UltralyticsCheckpoint read_ultralytics_checkpoint(const std::string& path) {
  return read_ultralytics_checkpoint_bytes(read_file(path), path);
}

LoadedModel model_from_checkpoint(const UltralyticsCheckpoint& ckpt, const std::string& source) {
  LoadedModel out;
  out.source = source;
  std::string scale;
  if (ckpt.yaml["scale"] && ckpt.yaml["scale"].IsScalar()) scale = ckpt.yaml["scale"].Scalar();
  if (scale.empty() && ckpt.yaml["yaml_file"] && ckpt.yaml["yaml_file"].IsScalar()) {
    scale = guess_model_scale(ckpt.yaml["yaml_file"].Scalar());
  }
  out.model = build_model(ckpt.yaml, source + " (embedded architecture)", scale, ckpt.nc);
  load_state_dict(*out.model, ckpt.weights, source);
  out.nc = ckpt.nc;
  out.names = ckpt.names;
  return out;
}

std::map<std::string, torch::Tensor> read_state_dict_file(const std::string& path) {
  const std::string bytes = read_file(path);
  try {
    const pickle::ValuePtr root = read_pt_archive(bytes);
    if (root->kind != Kind::kDict) throw std::runtime_error("not a dict");
    auto out = tensors_from(*root);
    if (out.size() != root->dict.size()) throw std::runtime_error("not a dict of named tensors");
    return out;
  } catch (const std::exception& e) {
    throw std::runtime_error(path + ": cannot read as a state dict: " + error_text(e));
  }
}

DetectionModel copy_model(const DetectionModel& model) {
  DetectionModel copy(model->config());
  if (model->is_fused()) copy->fuse();
  torch::NoGradGuard no_grad;
  // Module::to(dtype) would also turn the integer BatchNorm counters into floats; match tensor by tensor.
  {
    const auto src = state_dict(*model);
    auto dst = state_dict(*copy);
    for (size_t i = 0; i < src.size() && i < dst.size(); ++i) {
      dst[i].second.set_data(dst[i].second.to(src[i].second.device(), src[i].second.scalar_type()));
    }
  }
  const auto src = state_dict(*model);
  auto dst = state_dict(*copy);
  if (src.size() != dst.size()) throw std::logic_error("copy_model: state sizes differ");
  for (size_t i = 0; i < src.size(); ++i) {
    dst[i].second.copy_(src[i].second);
    dst[i].second.set_requires_grad(src[i].second.requires_grad());
  }
  copy->detect()->stride = model->detect()->stride.clone();
  copy->train(model->is_training());
  return copy;
}

size_t export_state_dict(const DetectionModel& model, const std::string& path) {
  c10::Dict<std::string, at::Tensor> dict;
  for (const auto& [name, t] : state_dict(*model)) dict.insert(name, t.detach().to(torch::kCPU).contiguous().clone());
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(dict));
  const fs::path p(path);
  if (p.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(p.parent_path(), ec);
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw std::runtime_error(path + ": cannot open for writing");
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error(path + ": write failed");
  return dict.size();
}

namespace {

// {state_dict, nc, names, yaml_scale} or a bare {name: tensor} dict: the architecture is yolov8(-p2).yaml,
// its scale read off the stem width.
LoadedModel model_from_state_dict_file(const Value& top, const std::string& path, int64_t nc_override) {
  if (top.kind != Kind::kDict) throw std::runtime_error(path + ": not a model file (top level is not a dict)");
  std::vector<std::string> names = names_from(top.get("names"));
  std::string scale;
  int64_t nc = 0;
  if (const Value* v = top.get("nc"); v && v->kind == Kind::kInt) nc = v->i;
  if (const Value* v = top.get("yaml_scale"); v && v->kind == Kind::kString) scale = v->s;
  const Value* sd_value = top.get("state_dict");
  std::map<std::string, torch::Tensor> tensors =
      tensors_from(sd_value && sd_value->kind == Kind::kDict ? *sd_value : top);
  int64_t head = -1;
  for (const auto& [key, t] : tensors) {
    if (key.rfind("model.", 0) == 0) head = std::max<int64_t>(head, std::atoll(key.c_str() + 6));
  }
  if (tensors.empty()) throw std::runtime_error(path + ": not a model file (no tensors)");
  if (head < 0) throw std::runtime_error(path + ": not a YOLOv8 detection state dict (no 'model.N.' weights)");
  const std::string cls_bias = "model." + std::to_string(head) + ".cv3.0.2.bias";
  if (!tensors.count(cls_bias) || !tensors.count("model.0.conv.weight")) {
    throw std::runtime_error(path + ": not a YOLOv8 detection state dict (no '" + cls_bias + "')");
  }
  if (nc <= 0) nc = tensors[cls_bias].numel();
  if (scale.empty()) {
    const int64_t stem = tensors["model.0.conv.weight"].size(0);
    const std::map<int64_t, std::string> by_width{{16, "n"}, {32, "s"}, {48, "m"}, {64, "l"}, {80, "x"}};
    if (!by_width.count(stem))
      throw std::runtime_error(path + ": cannot infer the model scale (stem width " + std::to_string(stem) + ")");
    scale = by_width.at(stem);
  }
  const std::string arch = head == 28 ? "yolov8-p2.yaml" : "yolov8.yaml";
  auto cfg = load_model_config(arch, nc);
  cfg = parse_model_config(cfg.yaml, cfg.source, scale, nc);
  LoadedModel out;
  out.source = path;
  if (nc_override > 0 && nc_override != nc) {
    out.model = DetectionModel(parse_model_config(cfg.yaml, cfg.source, scale, nc_override));
    load_matching(*out.model, tensors);
    nc = nc_override;
    names.clear();
  } else {
    out.model = DetectionModel(cfg);
    load_state_dict(*out.model, tensors, path);
  }
  out.nc = nc;
  fill_names(names, nc);
  out.names = names;
  return out;
}

}  // namespace

LoadedModel load_model(const std::string& spec, int64_t nc_override) {
  const fs::path p(spec);
  const std::string ext = p.extension().string();
  std::error_code ec;
  if (ext == ".yaml" || ext == ".yml" || (!fs::exists(p, ec) && ext.empty())) {
    LoadedModel out;
    out.model = build_model(spec, nc_override);
    out.nc = out.model->nc();
    out.source = out.model->config().source;
    fill_names(out.names, out.nc);
    return out;
  }
  const std::string bytes = read_file(spec);
  pickle::ValuePtr root;
  try {
    root = read_pt_archive(bytes);
  } catch (const std::exception& e) {
    throw std::runtime_error(spec + ": not a model file (" + error_text(e) + ")");
  }
  if (!is_checkpoint(*root)) return model_from_state_dict_file(*root, spec, nc_override);
  UltralyticsCheckpoint ck;
  try {
    ck = checkpoint_from(*root);
  } catch (const std::exception& e) {
    throw std::runtime_error(spec + ": cannot read as an Ultralytics YOLOv8 checkpoint: " + error_text(e));
  }
  root.reset();
  if (nc_override > 0 && nc_override != ck.nc) {
    // Fine-tuning on another class count: same architecture, every weight except the class convs.
    LoadedModel out;
    out.source = spec;
    std::string scale = ck.yaml["scale"] && ck.yaml["scale"].IsScalar() ? ck.yaml["scale"].Scalar() : std::string();
    out.model = build_model(ck.yaml, spec + " (embedded architecture)", scale, nc_override);
    load_matching(*out.model, ck.weights);
    out.nc = nc_override;
    fill_names(out.names, out.nc);
    return out;
  }
  return model_from_checkpoint(ck, spec);
}

}  // namespace yolo8
