#include "models/yolo.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <stdexcept>

namespace yolo8 {

namespace {

// A resolved YAML argument: 'nc' becomes the class count, 'None' stays textual.
struct Arg {
  YAML::Node node;
  int64_t nc;
  std::string source;
  int line;
  int64_t index;

  [[noreturn]] void bad(const std::string& what) const {
    throw std::runtime_error("model config " + source + (line > 0 ? ":" + std::to_string(line) : std::string()) +
                             ": layer " + std::to_string(index) + ": " + what);
  }
  bool is_none() const { return !node || node.IsNull() || (node.IsScalar() && node.Scalar() == "None"); }
  int64_t as_int() const {
    if (node.IsScalar() && node.Scalar() == "nc") return nc;
    try {
      return node.as<int64_t>();
    } catch (const YAML::Exception&) {
      bad("argument '" + (node.IsScalar() ? node.Scalar() : std::string("?")) + "' must be an integer");
    }
  }
  double as_double() const {
    try {
      return node.as<double>();
    } catch (const YAML::Exception&) {
      bad("argument must be a number");
    }
  }
  bool as_bool() const {
    try {
      return node.as<bool>();
    } catch (const YAML::Exception&) {
      bad("argument '" + (node.IsScalar() ? node.Scalar() : std::string("?")) + "' must be True or False");
    }
  }
  std::string as_string() const { return node.IsScalar() ? node.Scalar() : std::string(); }
};

constexpr int64_t kMaxChannels = 8192;
constexpr int64_t kMaxClasses = 100000;

int64_t make_divisible(double x, int64_t divisor) {
  return static_cast<int64_t>(std::ceil(x / static_cast<double>(divisor))) * divisor;
}

template <typename T>
std::string list_str(const std::vector<T>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

}  // namespace

DetectionModelImpl::DetectionModelImpl(const ModelConfig& cfg) : cfg_(cfg) {
  model = register_module("model", torch::nn::ModuleList());
  const auto n_layers = static_cast<int64_t>(cfg_.layers.size());
  std::vector<int64_t> ch;  // output channels per layer
  keep_.assign(cfg_.layers.size(), false);

  for (int64_t i = 0; i < n_layers; ++i) {
    const LayerSpec& spec = cfg_.layers[static_cast<size_t>(i)];
    auto arg = [&](size_t j) {
      return Arg{j < spec.args.size() ? spec.args[j] : YAML::Node(), cfg_.nc, cfg_.source, spec.line, i};
    };
    auto fail = [&](const std::string& what) { arg(0).bad(what); };
    const size_t nargs = spec.args.size();

    std::vector<int64_t> from_abs;
    for (int64_t f : spec.from) from_abs.push_back(f < 0 ? i + f : f);
    auto in_ch = [&](size_t k) { return i == 0 ? cfg_.ch : ch[static_cast<size_t>(from_abs[k])]; };
    for (int64_t a : from_abs) {
      if (a >= 0 && a < i) keep_[static_cast<size_t>(a)] = true;
    }

    int64_t n =
        spec.repeats > 1
            ? std::max<int64_t>(static_cast<int64_t>(std::nearbyint(static_cast<double>(spec.repeats) * cfg_.depth)), 1)
            : spec.repeats;
    const std::string& m = spec.module;
    const bool multi_input = m == "Concat" || m == "Detect";
    if (!multi_input && spec.from.size() != 1) fail(m + " takes exactly one input");
    if (m == "Detect" && i != n_layers - 1) fail("Detect must be the last layer");
    if (m != "Detect" && i == n_layers - 1) fail("the last layer must be Detect, got " + m);

    // Bounds that no real YOLOv8 variant approaches; they stop corrupt configs from allocating gigabytes.
    if (n > 64) fail("repeats " + std::to_string(n) + " is out of range (at most 64 after depth scaling)");
    auto check_kernel = [&](int64_t k, int64_t s) {
      if (k < 1 || k > 15 || s < 1 || s > 8)
        fail("kernel " + std::to_string(k) + " / stride " + std::to_string(s) + " out of range");
    };
    auto scaled = [&](int64_t c2) {
      if (c2 <= 0 || c2 > kMaxChannels) fail("output channels " + std::to_string(c2) + " out of range");
      return c2 != cfg_.nc ? make_divisible(static_cast<double>(std::min(c2, cfg_.max_channels)) * cfg_.width, 8) : c2;
    };

    std::vector<std::string> shown;  // resolved args for the info table
    std::function<std::shared_ptr<torch::nn::Module>()> make_one;
    LayerFn fn;
    int64_t c2 = 0;

    if (m == "Conv") {
      if (nargs < 1) fail("Conv needs [c2, k, s, p, g, d, act]");
      const int64_t c1 = in_ch(0);
      c2 = scaled(arg(0).as_int());
      const int64_t k = nargs > 1 ? arg(1).as_int() : 1, s = nargs > 2 ? arg(2).as_int() : 1;
      const int64_t p = nargs > 3 && !arg(3).is_none() ? arg(3).as_int() : -1;
      const int64_t g = nargs > 4 ? arg(4).as_int() : 1, d = nargs > 5 ? arg(5).as_int() : 1;
      const bool act = nargs > 6 ? arg(6).as_bool() : true;
      check_kernel(k, s);
      if (g < 1 || c1 % g != 0 || c2 % g != 0 || d < 1 || d > 8 || p > 16)
        fail("Conv groups/dilation/padding out of range");
      shown = {std::to_string(c1), std::to_string(c2), std::to_string(k), std::to_string(s)};
      make_one = [=]() { return Conv(c1, c2, k, s, p, g, d, act).ptr(); };
    } else if (m == "Bottleneck") {
      if (nargs < 1) fail("Bottleneck needs [c2, shortcut, g]");
      const int64_t c1 = in_ch(0);
      c2 = scaled(arg(0).as_int());
      const bool shortcut = nargs > 1 ? arg(1).as_bool() : true;
      const int64_t g = nargs > 2 ? arg(2).as_int() : 1;
      const double e = nargs > 4 ? arg(4).as_double() : 0.5;
      if (g < 1 || !(e > 0 && e <= 4)) fail("Bottleneck groups/expansion out of range");
      shown = {std::to_string(c1), std::to_string(c2), shortcut ? "True" : "False"};
      make_one = [=]() { return Bottleneck(c1, c2, shortcut, g, 3, 3, e).ptr(); };
    } else if (m == "C2f") {
      if (nargs < 1) fail("C2f needs [c2, shortcut, g, e]");
      const int64_t c1 = in_ch(0);
      c2 = scaled(arg(0).as_int());
      const bool shortcut = nargs > 1 ? arg(1).as_bool() : false;
      const int64_t g = nargs > 2 ? arg(2).as_int() : 1;
      const double e = nargs > 3 ? arg(3).as_double() : 0.5;
      if (g < 1 || !(e > 0 && e <= 4)) fail("C2f groups/expansion out of range");
      const int64_t reps = n;
      n = 1;
      shown = {std::to_string(c1), std::to_string(c2), std::to_string(reps), shortcut ? "True" : "False"};
      make_one = [=]() { return C2f(c1, c2, reps, shortcut, g, e).ptr(); };
    } else if (m == "SPPF") {
      if (nargs < 1) fail("SPPF needs [c2, k]");
      const int64_t c1 = in_ch(0);
      c2 = scaled(arg(0).as_int());
      const int64_t k = nargs > 1 ? arg(1).as_int() : 5;
      if (k <= 0 || k > 15 || k % 2 == 0) fail("SPPF kernel must be odd, 1..15");
      shown = {std::to_string(c1), std::to_string(c2), std::to_string(k)};
      make_one = [=]() { return SPPF(c1, c2, k).ptr(); };
    } else if (m == "nn.Upsample") {
      c2 = in_ch(0);
      if (nargs > 0 && !arg(0).is_none()) fail("nn.Upsample: only a scale factor is supported, size must be None");
      const double scale = nargs > 1 ? arg(1).as_double() : 2.0;
      if (scale != 2.0 && scale != 1.0 && scale != 4.0) fail("nn.Upsample: scale factor must be 1, 2 or 4");
      const std::string mode = nargs > 2 ? arg(2).as_string() : "nearest";
      if (mode != "nearest") fail("nn.Upsample: only mode 'nearest' is supported");
      std::ostringstream sc;
      sc << scale;
      shown = {"None", sc.str(), "'" + mode + "'"};
      make_one = [=]() { return Upsample(scale, mode).ptr(); };
    } else if (m == "Concat") {
      const int64_t dim = nargs > 0 ? arg(0).as_int() : 1;
      if (dim != 1) fail("Concat: only dimension 1 is supported");
      if (n != 1) fail("Concat cannot repeat");
      for (size_t k = 0; k < from_abs.size(); ++k) c2 += in_ch(k);
      shown = {std::to_string(dim)};
      auto cat = Concat(dim);
      make_one = [=]() { return cat.ptr(); };
      fn = [cat](const std::vector<torch::Tensor>& xs) mutable { return cat->forward(xs); };
    } else if (m == "Detect") {
      if (n != 1) fail("Detect cannot repeat");
      const int64_t nc = nargs > 0 ? arg(0).as_int() : cfg_.nc;
      if (nc < 1 || nc > kMaxClasses) fail("Detect: class count " + std::to_string(nc) + " out of range");
      std::vector<int64_t> chs;
      for (size_t k = 0; k < from_abs.size(); ++k) chs.push_back(in_ch(k));
      detect_ = Detect(nc, chs);
      shown = {std::to_string(nc), list_str(chs)};
      auto det = detect_;
      make_one = [det]() { return det.ptr(); };
      c2 = 0;
    } else {
      fail("unknown module '" + m + "' (supported: Conv, Bottleneck, C2f, SPPF, Concat, nn.Upsample, Detect)");
    }

    std::shared_ptr<torch::nn::Module> layer;
    if (m == "Concat" || m == "Detect") {
      layer = make_one();
    } else if (n > 1) {
      // Repeated single-input layers nest as model.i.0, model.i.1, ... like nn.Sequential.
      torch::nn::Sequential seq;
      for (int64_t r = 0; r < n; ++r) {
        auto one = make_one();
        if (auto c = std::dynamic_pointer_cast<ConvImpl>(one))
          seq->push_back(Conv(c));
        else if (auto b = std::dynamic_pointer_cast<BottleneckImpl>(one))
          seq->push_back(Bottleneck(b));
        else if (auto s = std::dynamic_pointer_cast<SPPFImpl>(one))
          seq->push_back(SPPF(s));
        else if (auto u = std::dynamic_pointer_cast<UpsampleImpl>(one))
          seq->push_back(Upsample(u));
        else
          fail(m + " cannot repeat");
      }
      layer = seq.ptr();
      fn = [seq](const std::vector<torch::Tensor>& xs) mutable { return seq->forward(xs[0]); };
    } else {
      layer = make_one();
      if (auto c = std::dynamic_pointer_cast<ConvImpl>(layer)) {
        fn = [c](const std::vector<torch::Tensor>& xs) mutable { return c->forward(xs[0]); };
      } else if (auto b = std::dynamic_pointer_cast<BottleneckImpl>(layer)) {
        fn = [b](const std::vector<torch::Tensor>& xs) mutable { return b->forward(xs[0]); };
      } else if (auto f = std::dynamic_pointer_cast<C2fImpl>(layer)) {
        fn = [f](const std::vector<torch::Tensor>& xs) mutable { return f->forward(xs[0]); };
      } else if (auto s = std::dynamic_pointer_cast<SPPFImpl>(layer)) {
        fn = [s](const std::vector<torch::Tensor>& xs) mutable { return s->forward(xs[0]); };
      } else if (auto u = std::dynamic_pointer_cast<UpsampleImpl>(layer)) {
        fn = [u](const std::vector<torch::Tensor>& xs) mutable { return u->forward(xs[0]); };
      }
    }
    model->push_back(layer);
    fns_.push_back(fn);
    if (i == 0) ch.clear();
    ch.push_back(c2);

    LayerRecord rec;
    rec.index = i;
    rec.from = spec.from;
    rec.repeats = n;
    rec.module = m;
    rec.args = list_str(shown);
    rec.out_channels = c2;
    rec.module_ptr = layer;
    records_.push_back(std::move(rec));
  }
  if (!detect_) throw std::runtime_error("model config " + cfg_.source + ": no Detect layer");

  // Strides from a dry run (eval mode: the statistics are set below, independent of the probe size).
  {
    torch::NoGradGuard no_grad;
    const bool was_training = is_training();
    eval();
    // A small probe is enough for P5 models; deeper ones (P6+) need Ultralytics' 256.
    int64_t s = 64;
    std::vector<torch::Tensor> maps;
    try {
      maps = forward_maps(torch::zeros({1, cfg_.ch, s, s}));
      for (const auto& mp : maps) {
        if (mp.size(2) <= 1) throw std::runtime_error("probe too small");  // a 1×1 map hides its true stride
      }
    } catch (const std::exception&) {
      s = 256;
      try {
        maps = forward_maps(torch::zeros({1, cfg_.ch, s, s}));
      } catch (const std::exception& e) {
        throw std::runtime_error("model config " + cfg_.source + ": the layers do not fit together (" +
                                 std::string(e.what()).substr(0, 200) + ")");
      }
    }
    train(was_training);
    std::vector<double> st;
    for (const auto& mp : maps) st.push_back(static_cast<double>(s) / static_cast<double>(mp.size(2)));
    detect_->stride = torch::tensor(st, torch::kFloat);
  }
  detect_->bias_init();
  // Ultralytics runs that probe in train mode on zeros with the default momentum 0.1, before setting 0.03:
  // every BatchNorm then sees zero mean and variance once. Reproduce its fresh state exactly.
  {
    torch::NoGradGuard no_grad;
    for (const auto& m : modules(false)) {
      if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(m)) {
        bn->running_var.fill_(0.9);
        bn->num_batches_tracked.fill_(1);
      }
    }
  }
}

std::vector<torch::Tensor> DetectionModelImpl::forward_maps(const torch::Tensor& x) {
  if (x.dim() != 4 || x.size(1) != cfg_.ch) {
    throw std::invalid_argument("DetectionModel: expected input B×" + std::to_string(cfg_.ch) + "×H×W, got " +
                                list_str(x.sizes().vec()));
  }
  const size_t n = fns_.size();
  std::vector<torch::Tensor> outs(n);
  torch::Tensor cur = x;
  for (size_t i = 0; i < n; ++i) {
    const auto& spec = cfg_.layers[i];
    std::vector<torch::Tensor> inputs;
    inputs.reserve(spec.from.size());
    for (int64_t f : spec.from) {
      inputs.push_back(f == -1 ? cur : outs[static_cast<size_t>(f < 0 ? static_cast<int64_t>(i) + f : f)]);
    }
    if (i + 1 == n) return detect_->forward_maps(inputs);
    cur = fns_[i](inputs);
    if (keep_[i]) outs[i] = cur;
  }
  throw std::logic_error("DetectionModel: no Detect layer");
}

DetectOutput DetectionModelImpl::forward(const torch::Tensor& x) {
  DetectOutput out;
  out.feats = forward_maps(x);
  if (!is_training()) out.pred = detect_->decode(out.feats);
  return out;
}

torch::Tensor DetectionModelImpl::predict(const torch::Tensor& x) { return detect_->decode(forward_maps(x)); }

void DetectionModelImpl::fuse() {
  for (auto& m : modules()) {
    if (auto c = std::dynamic_pointer_cast<ConvImpl>(m)) c->fuse();
  }
  fused_ = true;
}

int64_t DetectionModelImpl::max_stride() const {
  return std::max<int64_t>(static_cast<int64_t>(detect_->stride.max().item<double>()), 32);
}

DetectionModel build_model(const std::string& yaml_spec, int64_t nc_override) {
  return DetectionModel(load_model_config(yaml_spec, nc_override));
}

DetectionModel build_model(const YAML::Node& yaml, const std::string& source, const std::string& scale,
                           int64_t nc_override) {
  return DetectionModel(parse_model_config(yaml, source, scale, nc_override));
}

}  // namespace yolo8
