#include "trainer/export/onnx_export.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "models/weights.h"

namespace yolo8 {
namespace {

// IR version 7 is what ONNX 1.7+ writes for opsets 12 and 13; every runtime that reads those opsets reads it.
constexpr int64_t kIrVersion = 7;

// Builds one GraphProto: initializers from tensors, nodes with unique output names.
class GraphWriter {
 public:
  explicit GraphWriter(onnx::GraphProto* graph) : graph_(graph) {}

  // A float32 (any floating input) or int64 initializer; returns its name.
  std::string constant(const std::string& name, const torch::Tensor& value) {
    onnx::TensorProto* t = graph_->add_initializer();
    t->set_name(name);
    const torch::Tensor cpu = value.detach().to(torch::kCPU).contiguous();
    for (int64_t d : cpu.sizes()) t->add_dims(d);
    if (cpu.scalar_type() == torch::kLong) {
      t->set_data_type(onnx::TensorProto::INT64);
      t->set_raw_data(std::string(static_cast<const char*>(cpu.data_ptr()), cpu.numel() * sizeof(int64_t)));
    } else {
      const torch::Tensor f = cpu.to(torch::kFloat).contiguous();
      t->set_data_type(onnx::TensorProto::FLOAT);
      // raw_data is little-endian, as is every machine LibTorch runs on.
      t->set_raw_data(std::string(static_cast<const char*>(f.data_ptr()), f.numel() * sizeof(float)));
    }
    return name;
  }
  std::string shape_constant(const std::string& name, const std::vector<int64_t>& dims) {
    return constant(name, torch::tensor(dims, torch::kLong));
  }

  onnx::NodeProto* node(const std::string& op, const std::string& name, const std::vector<std::string>& inputs,
                        const std::string& output) {
    onnx::NodeProto* n = graph_->add_node();
    n->set_op_type(op);
    n->set_name(name);
    for (const auto& in : inputs) n->add_input(in);
    n->add_output(output);
    return n;
  }

  static void ints(onnx::NodeProto* n, const std::string& name, const std::vector<int64_t>& values) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (int64_t v : values) a->add_ints(v);
  }
  static void integer(onnx::NodeProto* n, const std::string& name, int64_t value) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(value);
  }
  static void text(onnx::NodeProto* n, const std::string& name, const std::string& value) {
    onnx::AttributeProto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(value);
  }

 private:
  onnx::GraphProto* graph_;
};

// Emits the layers of a fused model, naming values after the module paths (model.4.m.0.cv1, ...).
class ModelWriter {
 public:
  ModelWriter(GraphWriter& graph, int64_t opset) : g_(graph), opset_(opset) {}

  // Fused Conv + optional SiLU (x·sigmoid(x): the two operators every runtime has).
  std::string conv(const std::string& path, ConvImpl& m, const std::string& x) {
    if (!m.fused()) throw std::logic_error("export: " + path + " is not fused");
    std::string y = conv2d(path + ".conv", *m.conv, x);
    if (!m.has_act()) return y;
    const std::string s = g_.node("Sigmoid", path + "/Sigmoid", {y}, path + ".sigmoid")->output(0);
    return g_.node("Mul", path + "/Mul", {y, s}, path + ".silu")->output(0);
  }

  std::string conv2d(const std::string& path, torch::nn::Conv2dImpl& c, const std::string& x) {
    const auto& o = c.options;
    std::vector<std::string> inputs{x, g_.constant(path + ".weight", c.weight)};
    if (c.bias.defined()) inputs.push_back(g_.constant(path + ".bias", c.bias));
    const auto* pad = std::get_if<torch::ExpandingArray<2>>(&o.padding());
    if (pad == nullptr) throw std::logic_error("export: " + path + " uses a padding mode name");
    onnx::NodeProto* n = g_.node("Conv", path + "/Conv", inputs, path);
    const auto k = o.kernel_size(), s = o.stride(), d = o.dilation();
    GraphWriter::ints(n, "kernel_shape", {k->at(0), k->at(1)});
    GraphWriter::ints(n, "strides", {s->at(0), s->at(1)});
    GraphWriter::ints(n, "dilations", {d->at(0), d->at(1)});
    GraphWriter::ints(n, "pads", {(*pad)->at(0), (*pad)->at(1), (*pad)->at(0), (*pad)->at(1)});
    GraphWriter::integer(n, "group", o.groups());
    return path;
  }

  std::string bottleneck(const std::string& path, BottleneckImpl& m, const std::string& x) {
    std::string y = conv(path + ".cv2", *m.cv2, conv(path + ".cv1", *m.cv1, x));
    if (!m.adds_input()) return y;
    return g_.node("Add", path + "/Add", {x, y}, path + ".add")->output(0);
  }

  std::string c2f(const std::string& path, C2fImpl& m, const std::string& x) {
    const std::string y = conv(path + ".cv1", *m.cv1, x);
    const int64_t half = m.cv1->conv->options.out_channels() / 2;
    // Two equal halves; OpenCV 4.6 ignores Split's sizes input (opset 13) and splits evenly, which is the same.
    onnx::NodeProto* split = g_.node("Split", path + "/Split", {y}, path + ".split0");
    split->add_output(path + ".split1");
    GraphWriter::integer(split, "axis", 1);
    if (opset_ >= 13) {
      split->add_input(g_.shape_constant(path + ".split_sizes", {half, half}));
    } else {
      GraphWriter::ints(split, "split", {half, half});
    }
    std::vector<std::string> ys{split->output(0), split->output(1)};
    for (size_t i = 0; i < m.m->size(); ++i) {
      auto b = m.m->ptr<BottleneckImpl>(i);
      ys.push_back(bottleneck(path + ".m." + std::to_string(i), *b, ys.back()));
    }
    return conv(path + ".cv2", *m.cv2, concat(path + "/Concat", ys, path + ".cat"));
  }

  std::string sppf(const std::string& path, SPPFImpl& m, const std::string& x) {
    std::vector<std::string> ys{conv(path + ".cv1", *m.cv1, x)};
    const auto& o = m.m->options;
    const int64_t k = o.kernel_size()->at(0), p = o.padding()->at(0);
    for (int i = 0; i < 3; ++i) {
      const std::string name = path + ".m." + std::to_string(i);
      onnx::NodeProto* n = g_.node("MaxPool", name + "/MaxPool", {ys.back()}, name);
      GraphWriter::ints(n, "kernel_shape", {k, k});
      GraphWriter::ints(n, "strides", {1, 1});
      GraphWriter::ints(n, "pads", {p, p, p, p});
      ys.push_back(name);
    }
    return conv(path + ".cv2", *m.cv2, concat(path + "/Concat", ys, path + ".cat"));
  }

  std::string upsample(const std::string& path, UpsampleImpl& m, const std::string& x) {
    // Nearest with integer scales: asymmetric + floor is PyTorch's "nearest". Constant scales, no sizes input.
    const float s = static_cast<float>(m.scale());
    const std::string roi = g_.constant(path + ".roi", torch::zeros({0}, torch::kFloat));
    const std::string scales = g_.constant(path + ".scales", torch::tensor({1.0f, 1.0f, s, s}));
    onnx::NodeProto* n = g_.node("Resize", path + "/Resize", {x, roi, scales}, path);
    GraphWriter::text(n, "mode", "nearest");
    GraphWriter::text(n, "coordinate_transformation_mode", "asymmetric");
    GraphWriter::text(n, "nearest_mode", "floor");
    return path;
  }

  std::string concat(const std::string& name, const std::vector<std::string>& xs, const std::string& out,
                     int64_t axis = 1) {
    onnx::NodeProto* n = g_.node("Concat", name, xs, out);
    GraphWriter::integer(n, "axis", axis);
    return out;
  }

  std::string reshape(const std::string& path, const std::string& x, const std::vector<int64_t>& dims) {
    return g_.node("Reshape", path + "/Reshape", {x, g_.shape_constant(path + ".shape", dims)}, path)->output(0);
  }

  // One single-input module (or a Sequential of them, for repeated layers).
  std::string layer(const std::string& path, torch::nn::Module& module, const std::string& x) {
    if (auto* c = dynamic_cast<ConvImpl*>(&module)) return conv(path, *c, x);
    if (auto* b = dynamic_cast<BottleneckImpl*>(&module)) return bottleneck(path, *b, x);
    if (auto* f = dynamic_cast<C2fImpl*>(&module)) return c2f(path, *f, x);
    if (auto* s = dynamic_cast<SPPFImpl*>(&module)) return sppf(path, *s, x);
    if (auto* u = dynamic_cast<UpsampleImpl*>(&module)) return upsample(path, *u, x);
    if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&module)) {
      std::string y = x;
      for (size_t i = 0; i < seq->size(); ++i) y = layer(path + "." + std::to_string(i), *seq->ptr(i), y);
      return y;
    }
    throw std::invalid_argument("export: " + path + ": module " + module.name() + " has no ONNX form");
  }

 private:
  GraphWriter& g_;
  int64_t opset_;
};

std::string python_string(const std::string& s) {
  // Python's repr: single quotes unless the text has a single quote and no double quote.
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (char c : s) {
    if (c == '\\' || c == q) out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out + q;
}

void add_meta(onnx::ModelProto& model, const std::string& key, const std::string& value) {
  onnx::StringStringEntryProto* p = model.add_metadata_props();
  p->set_key(key);
  p->set_value(value);
}

std::string today() {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &tm);
  return buf;
}

}  // namespace

std::string python_names_dict(const std::vector<std::string>& names) {
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    out += (i ? ", " : "") + std::to_string(i) + ": " + python_string(names[i]);
  }
  return out + "}";
}

void check_onnx_options(const OnnxExportOptions& options, int64_t max_stride) {
  if (options.opset != 12 && options.opset != 13) {
    throw std::invalid_argument(
        "setting 'opset' must be 12 or 13 for format=onnx (the opsets OpenCV DNN 4.6 and ONNX Runtime both load), "
        "got " +
        std::to_string(options.opset));
  }
  if (options.dynamic) {
    throw std::invalid_argument(
        "setting 'dynamic' must be false for format=onnx: the graph is static (constant Reshape targets and anchor "
        "tensors for one input size), because OpenCV DNN 4.6 cannot load the shape subgraphs a dynamic graph needs; "
        "export once per input size with imgsz=H,W");
  }
  if (options.half) {
    throw std::invalid_argument(
        "setting 'half' must be false for format=onnx: the graph is written in float32 (OpenCV DNN's CPU backend "
        "runs float32 only)");
  }
  for (int64_t side : {options.height, options.width}) {
    if (side <= 0 || side % max_stride != 0 || side > 8192) {
      throw std::invalid_argument("setting 'imgsz' must be a multiple of the model's stride " +
                                  std::to_string(max_stride) + " (at most 8192), got " +
                                  std::to_string(options.height) + "," + std::to_string(options.width));
    }
  }
}

OnnxExportSummary export_onnx(const DetectionModel& source_model, const OnnxExportOptions& options,
                              const std::string& path) {
  check_onnx_options(options, source_model->max_stride());
  torch::NoGradGuard no_grad;
  DetectionModel model = copy_model(source_model);
  model->to(torch::kCPU, torch::kFloat);
  model->eval();
  model->fuse();

  // Level sizes and anchors for this input size, from the model itself.
  const std::vector<torch::Tensor> maps =
      model->forward_maps(torch::zeros({1, model->config().ch, options.height, options.width}));
  Detect det = model->detect();
  const int64_t nc = det->nc();
  auto [points, strides] = make_anchors(maps, det->stride, 0.5);
  const int64_t anchors = points.size(0);

  onnx::ModelProto proto;
  proto.set_ir_version(kIrVersion);
  proto.set_producer_name("yolo8");
  proto.set_producer_version(options.version);
  proto.set_model_version(1);
  onnx::OperatorSetIdProto* opset = proto.add_opset_import();
  opset->set_domain("");
  opset->set_version(options.opset);
  onnx::GraphProto* graph = proto.mutable_graph();
  graph->set_name("yolo8");

  auto add_value = [](onnx::ValueInfoProto* v, const std::string& name, const std::vector<int64_t>& dims) {
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->mutable_shape()->add_dim()->set_dim_value(d);
  };
  add_value(graph->add_input(), "images", {1, model->config().ch, options.height, options.width});
  add_value(graph->add_output(), "output0", {1, 4 + nc, anchors});

  GraphWriter g(graph);
  ModelWriter w(g, options.opset);
  const auto& records = model->layers();
  std::vector<std::string> outs(records.size());
  std::string cur = "images";
  for (size_t i = 0; i + 1 < records.size(); ++i) {
    const LayerRecord& rec = records[i];
    const std::string name = "model." + std::to_string(rec.index);
    std::vector<std::string> inputs;
    for (int64_t f : rec.from)
      inputs.push_back(f == -1 ? cur : outs.at(static_cast<size_t>(f < 0 ? rec.index + f : f)));
    if (rec.module == "Concat") {
      cur = w.concat(name + "/Concat", inputs, name);
    } else {
      cur = w.layer(name, *rec.module_ptr, inputs.at(0));
    }
    outs[i] = cur;
  }

  // Detect: box and class branches per level, flattened to constant shapes and joined along the anchors.
  const LayerRecord& head = records.back();
  const std::string hp = "model." + std::to_string(head.index);
  std::vector<std::string> boxes, scores;
  for (size_t i = 0; i < head.from.size(); ++i) {
    const int64_t f = head.from[i];
    const std::string x = f == -1 ? cur : outs.at(static_cast<size_t>(f < 0 ? head.index + f : f));
    const int64_t cells = maps[i].size(2) * maps[i].size(3);
    auto box = det->cv2->ptr<torch::nn::SequentialImpl>(i);
    auto cls = det->cv3->ptr<torch::nn::SequentialImpl>(i);
    const std::string bp = hp + ".cv2." + std::to_string(i), cp = hp + ".cv3." + std::to_string(i);
    std::string b = w.conv(bp + ".0", *box->ptr<ConvImpl>(0), x);
    b = w.conv(bp + ".1", *box->ptr<ConvImpl>(1), b);
    b = w.conv2d(bp + ".2", *box->ptr<torch::nn::Conv2dImpl>(2), b);
    boxes.push_back(w.reshape(bp + ".flat", b, {1, 4 * kRegMax, cells}));
    std::string c = w.conv(cp + ".0", *cls->ptr<ConvImpl>(0), x);
    c = w.conv(cp + ".1", *cls->ptr<ConvImpl>(1), c);
    c = w.conv2d(cp + ".2", *cls->ptr<torch::nn::Conv2dImpl>(2), c);
    scores.push_back(w.reshape(cp + ".flat", c, {1, nc, cells}));
  }
  const std::string box_all = w.concat(hp + "/ConcatBoxes", boxes, hp + ".boxes", 2);
  const std::string cls_all = w.concat(hp + "/ConcatScores", scores, hp + ".scores", 2);

  // DFL: softmax over the 16 bins on the last axis (the same in opset 12's and 13's Softmax), then the expected
  // bin as a MatMul with 0..15.
  const std::string dp = hp + ".dfl";
  std::string d = w.reshape(dp + ".bins", box_all, {1, 4, kRegMax, anchors});
  onnx::NodeProto* tr = g.node("Transpose", dp + "/Transpose", {d}, dp + ".last");
  GraphWriter::ints(tr, "perm", {0, 1, 3, 2});
  onnx::NodeProto* sm = g.node("Softmax", dp + "/Softmax", {tr->output(0)}, dp + ".softmax");
  GraphWriter::integer(sm, "axis", 3);
  const std::string bins = g.constant(dp + ".conv.weight", torch::arange(kRegMax, torch::kFloat).view({kRegMax, 1}));
  d = g.node("MatMul", dp + "/MatMul", {sm->output(0), bins}, dp)->output(0);  // 1×4×A×1: l, t, r, b

  // dist2bbox as a 1×1 convolution: cx = (r-l)/2, cy = (b-t)/2, w = l+r, h = t+b; then + anchor, × stride,
  // both constants at the full 1×4×A×1 shape.
  const torch::Tensor mix =
      torch::tensor({-0.5f, 0.f, 0.5f, 0.f, 0.f, -0.5f, 0.f, 0.5f, 1.f, 0.f, 1.f, 0.f, 0.f, 1.f, 0.f, 1.f})
          .view({4, 4, 1, 1});
  onnx::NodeProto* mixn =
      g.node("Conv", hp + "/dist2bbox", {d, g.constant(hp + ".dist2bbox.weight", mix)}, hp + ".xywh_grid");
  GraphWriter::ints(mixn, "kernel_shape", {1, 1});
  const torch::Tensor offsets =
      torch::cat({points.transpose(0, 1), torch::zeros({2, anchors})}, 0).view({1, 4, anchors, 1});
  const torch::Tensor scale = strides.transpose(0, 1).expand({4, anchors}).contiguous().view({1, 4, anchors, 1});
  std::string xywh =
      g.node("Add", hp + "/AddAnchors", {mixn->output(0), g.constant(hp + ".anchors", offsets)}, hp + ".xywh_cells")
          ->output(0);
  xywh = g.node("Mul", hp + "/MulStrides", {xywh, g.constant(hp + ".strides", scale)}, hp + ".xywh_pixels")->output(0);
  xywh = w.reshape(hp + ".xywh", xywh, {1, 4, anchors});
  const std::string probs = g.node("Sigmoid", hp + "/Sigmoid", {cls_all}, hp + ".probs")->output(0);
  w.concat(hp + "/Concat", {xywh, probs}, "output0");

  // Metadata as Ultralytics writes it (str() of Python values), so its loaders and ours read the same keys.
  std::vector<std::string> names = options.names;
  if (names.empty()) {
    for (int64_t i = 0; i < nc; ++i) names.push_back("class" + std::to_string(i));
  }
  if (static_cast<int64_t>(names.size()) != nc) {
    throw std::invalid_argument("export: " + std::to_string(names.size()) +
                                " class names for a model with nc=" + std::to_string(nc));
  }
  add_meta(proto, "description",
           "yolo8 YOLOv8 detection model" + (options.source.empty() ? std::string() : " from " + options.source));
  add_meta(proto, "author", "yolo8");
  add_meta(proto, "date", today());
  add_meta(proto, "version", options.version);
  add_meta(proto, "task", "detect");
  add_meta(proto, "stride", std::to_string(model->max_stride()));
  add_meta(proto, "batch", "1");
  add_meta(proto, "imgsz", "[" + std::to_string(options.height) + ", " + std::to_string(options.width) + "]");
  add_meta(proto, "names", python_names_dict(names));

  try {
    onnx::checker::check_model(proto);
  } catch (const std::exception& e) {
    throw std::logic_error(std::string("export: the ONNX checker rejects the graph: ") + e.what());
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out || !proto.SerializeToOstream(&out) || !out.flush()) {
    throw std::runtime_error("export: cannot write " + path);
  }

  OnnxExportSummary summary;
  summary.nodes = graph->node_size();
  summary.initializers = graph->initializer_size();
  summary.anchors = anchors;
  summary.nc = nc;
  return summary;
}

}  // namespace yolo8
