#include "models/model_info.h"

#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <variant>

namespace yolo8 {

namespace {

struct Size2 {
  int64_t h, w;
};

// Chains the module's convolutions in registration order (every YOLOv8 block lists them in data order
// or keeps the size); returns multiply-adds and updates the spatial size.
double conv_chain_macs(const torch::nn::Module& m, Size2& s) {
  double macs = 0;
  for (const auto& sub : m.modules(/*include_self=*/true)) {
    const auto* c = dynamic_cast<const torch::nn::Conv2dImpl*>(sub.get());
    if (!c) continue;
    const auto& o = c->options;
    const auto k = *o.kernel_size(), st = *o.stride(), d = *o.dilation();
    // c10::variant in LibTorch 1.x, std::variant in 2.x: the using-declaration plus ADL picks the right get_if.
    using std::get_if;
    const auto* pad = get_if<torch::ExpandingArray<2>>(&o.padding());
    const int64_t ph = pad ? (**pad)[0] : 0, pw = pad ? (**pad)[1] : 0;
    const int64_t oh = (s.h + 2 * ph - d[0] * (k[0] - 1) - 1) / st[0] + 1;
    const int64_t ow = (s.w + 2 * pw - d[1] * (k[1] - 1) - 1) / st[1] + 1;
    const int64_t in_per_group = o.in_channels() / o.groups();  // exact: groups divides the channels
    macs += static_cast<double>(oh * ow) * static_cast<double>(o.out_channels()) * static_cast<double>(in_per_group) *
            static_cast<double>(k[0] * k[1]);
    s = {oh, ow};
  }
  return macs;
}

std::string from_str(const std::vector<int64_t>& from) {
  if (from.size() == 1) return std::to_string(from[0]);
  std::string s = "[";
  for (size_t i = 0; i < from.size(); ++i) s += (i ? ", " : "") + std::to_string(from[i]);
  return s + "]";
}

}  // namespace

double model_gflops(DetectionModel& model, int64_t h, int64_t w) {
  const int64_t ms = model->max_stride();
  if (h <= 0 || w <= 0 || h % ms != 0 || w % ms != 0) {
    throw std::invalid_argument("model_gflops: image size must be a positive multiple of " + std::to_string(ms));
  }
  const auto& layers = model->layers();
  std::vector<Size2> out(layers.size());
  Size2 cur{h, w};
  double macs = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const auto& rec = layers[i];
    std::vector<Size2> in;
    for (int64_t f : rec.from)
      in.push_back(f == -1 ? cur : out[static_cast<size_t>(f < 0 ? static_cast<int64_t>(i) + f : f)]);
    if (auto det = std::dynamic_pointer_cast<DetectImpl>(rec.module_ptr)) {
      int64_t anchors = 0;
      for (size_t l = 0; l < in.size(); ++l) {
        Size2 a = in[l], b = in[l];
        macs += conv_chain_macs(*det->cv2[l], a) + conv_chain_macs(*det->cv3[l], b);
        anchors += in[l].h * in[l].w;
      }
      macs += static_cast<double>(anchors * 4 * kRegMax);  // DFL 1×1 conv
      cur = in[0];
    } else if (rec.module == "nn.Upsample") {
      cur = in[0];
      for (const auto& m : rec.module_ptr->modules(true)) {
        if (auto up = std::dynamic_pointer_cast<UpsampleImpl>(m)) {
          cur = {static_cast<int64_t>(static_cast<double>(cur.h) * up->scale()),
                 static_cast<int64_t>(static_cast<double>(cur.w) * up->scale())};
        }
      }
    } else if (rec.module == "Concat") {
      cur = in[0];
    } else {
      cur = in[0];
      macs += conv_chain_macs(*rec.module_ptr, cur);
    }
    out[i] = cur;
  }
  return 2.0 * macs / 1e9;
}

ModelInfo model_info(DetectionModel& model, int64_t imgsz) {
  ModelInfo info;
  info.imgsz = imgsz;
  for (const auto& rec : model->layers()) {
    LayerInfoRow row;
    row.index = rec.index;
    row.from = from_str(rec.from);
    row.repeats = rec.repeats;
    for (const auto& p : rec.module_ptr->parameters()) row.params += p.numel();
    row.module = rec.module;
    row.args = rec.args;
    info.rows.push_back(row);
  }
  bool any_act = false;
  for (const auto& m : model->modules()) {
    if (auto c = std::dynamic_pointer_cast<ConvImpl>(m); c && c->has_act()) any_act = true;
  }
  info.layers = static_cast<int64_t>(model->modules().size()) + (any_act ? 1 : 0);
  for (const auto& p : model->parameters()) {
    info.parameters += p.numel();
    if (p.requires_grad()) info.gradients += p.numel();
  }
  info.gflops = model_gflops(model, imgsz, imgsz);
  return info;
}

std::string format_model_info(const ModelInfo& info, const std::string& name) {
  std::ostringstream os;
  char buf[512];
  std::snprintf(buf, sizeof buf, "%4s %18s %3s %10s  %-14s %s\n", "", "from", "n", "params", "module", "arguments");
  os << buf;
  for (const auto& r : info.rows) {
    std::snprintf(buf, sizeof buf, "%4lld %18s %3lld %10lld  %-14s %s\n", static_cast<long long>(r.index),
                  r.from.c_str(), static_cast<long long>(r.repeats), static_cast<long long>(r.params), r.module.c_str(),
                  r.args.c_str());
    os << buf;
  }
  std::snprintf(buf, sizeof buf, "%s summary: %lld layers, %lld parameters, %lld gradients, %.1f GFLOPs (%lldx%lld)\n",
                name.c_str(), static_cast<long long>(info.layers), static_cast<long long>(info.parameters),
                static_cast<long long>(info.gradients), info.gflops, static_cast<long long>(info.imgsz),
                static_cast<long long>(info.imgsz));
  os << buf;
  return os.str();
}

}  // namespace yolo8
