#include "trainer/detect/metrics.h"

#include <cmath>
#include <cstdio>
#include <stdexcept>

#include "trainer/detect/box_ops.h"

namespace yolo8 {

namespace {

const auto kDouble = torch::TensorOptions().dtype(torch::kDouble);
const auto kLong = torch::TensorOptions().dtype(torch::kLong);

// numpy.linspace(0, 1, n): i * (1 / (n - 1)), last point exactly 1.
torch::Tensor unit_linspace(int64_t n) {
  auto x = torch::arange(n, kDouble) * (1.0 / static_cast<double>(n - 1));
  x[n - 1] = 1.0;
  return x;
}

}  // namespace

torch::Tensor default_iou_thresholds() { return torch::linspace(0.5, 0.95, 10, torch::kFloat32); }

double detection_fitness(double map50, double map50_95) { return 0.1 * map50 + 0.9 * map50_95; }

torch::Tensor match_predictions(const torch::Tensor& pred_classes, const torch::Tensor& true_classes,
                                const torch::Tensor& iou_in, const torch::Tensor& iou_thresholds) {
  const auto n = pred_classes.size(0);
  const auto m = true_classes.size(0);
  const auto t = iou_thresholds.size(0);
  if (n == 0 || m == 0) return torch::zeros({n, t}, torch::kBool);
  auto same_class = true_classes.unsqueeze(1) == pred_classes.unsqueeze(0);  // (M, N)
  auto iou = iou_in * same_class.to(iou_in.scalar_type());
  // The reference walks matches in descending IoU; equal IoUs then favour the later label.
  auto thr = iou_thresholds.to(iou.scalar_type()).view({t, 1, 1});
  auto ok = iou.unsqueeze(0) >= thr;  // (T, M, N)
  auto masked = torch::where(ok, iou.unsqueeze(0).expand({t, m, n}), torch::full({}, -1.0, iou.options()));
  auto flipped = masked.flip({1});
  auto best = flipped.max(1);                     // over labels
  auto best_label = (m - 1) - std::get<1>(best);  // (T, N)
  auto has_match = std::get<0>(best) >= 0;        // (T, N)
  // Each label keeps only the lowest-index detection that chose it.
  auto det_idx = torch::arange(n, kLong).view({1, 1, n});
  auto chose = (best_label.unsqueeze(1) == torch::arange(m, kLong).view({1, m, 1})) & has_match.unsqueeze(1);
  auto first_det = torch::where(chose, det_idx, torch::full({}, n, kLong)).amin(2);  // (T, M)
  auto winner = chose & (det_idx == first_det.unsqueeze(2));                         // (T, M, N)
  return winner.any(1).transpose(0, 1).contiguous();                                 // (N, T)
}

torch::Tensor match_detections(const torch::Tensor& detections, const torch::Tensor& labels,
                               const torch::Tensor& iou_thresholds) {
  const auto n = detections.size(0);
  if (n == 0 || labels.size(0) == 0) return torch::zeros({n, iou_thresholds.size(0)}, torch::kBool);
  auto iou = box_iou_matrix(labels.narrow(1, 1, 4), detections.narrow(1, 0, 4));
  return match_predictions(detections.select(1, 5), labels.select(1, 0), iou, iou_thresholds);
}

torch::Tensor interp(const torch::Tensor& x, const torch::Tensor& xp, const torch::Tensor& fp, double left,
                     double right) {
  const auto len = xp.size(-1);
  if (len == 0) throw std::invalid_argument("interp: empty xp");
  auto xc = x.contiguous();
  auto xpc = xp.contiguous();
  // j: last index with xp[j] <= x (numpy's search), -1 when x < xp[0].
  auto j = torch::searchsorted(xpc, xc, /*out_int32=*/false, /*right=*/true) - 1;
  auto jc = j.clamp(0, len - 1);
  auto jn = (j + 1).clamp(0, len - 1);
  auto x0 = xpc.gather(-1, jc);
  auto x1 = xpc.gather(-1, jn);
  auto f0 = fp.gather(-1, jc);
  auto f1 = fp.gather(-1, jn);
  auto slope = (f1 - f0) / (x1 - x0);
  auto y = slope * (xc - x0) + f0;
  y = torch::where(x0 == xc, f0, y);
  y = torch::where(j == len - 1, f0, y);
  y = torch::where(xc > xpc.narrow(-1, len - 1, 1), torch::full({}, right, y.options()), y);
  y = torch::where(j < 0, torch::full({}, left, y.options()), y);
  return y;
}

torch::Tensor compute_ap(const torch::Tensor& recall, const torch::Tensor& precision) {
  auto lead = recall.sizes().vec();
  lead.back() = 1;
  auto mrec = torch::cat({torch::zeros(lead, kDouble), recall.to(torch::kDouble), torch::ones(lead, kDouble)}, -1);
  auto mpre = torch::cat({torch::ones(lead, kDouble), precision.to(torch::kDouble), torch::zeros(lead, kDouble)}, -1);
  mpre = std::get<0>(mpre.flip(-1).cummax(-1)).flip(-1);  // precision envelope
  auto xs = unit_linspace(101);
  auto shape = lead;
  shape.back() = 101;
  auto y = interp(xs.expand(shape), mrec, mpre, 0.0, 0.0);
  // Trapezoid rule; the envelope makes left/right irrelevant (x spans [0, 1] = [mrec0, mrec_last]).
  auto dx = xs.narrow(0, 1, 100) - xs.narrow(0, 0, 100);
  return (dx * (y.narrow(-1, 1, 100) + y.narrow(-1, 0, 100)) / 2.0).sum(-1);
}

torch::Tensor smooth_curve(const torch::Tensor& y, double f) {
  const auto len = y.size(0);
  const int64_t nf =
      static_cast<int64_t>(std::nearbyint(static_cast<double>(len) * f * 2)) / 2 + 1;  // odd, banker's rounding
  const int64_t pad = nf / 2;
  auto yd = y.to(torch::kDouble);
  auto yp = torch::cat({yd.narrow(0, 0, 1).expand({pad}), yd, yd.narrow(0, len - 1, 1).expand({pad})});
  // Window sums times 1/nf, as a convolution with a constant kernel.
  auto windows = yp.unfold(0, nf, 1);  // (len, nf)
  return (windows * (1.0 / static_cast<double>(nf))).sum(1);
}

ApPerClass ap_per_class(const torch::Tensor& tp_in, const torch::Tensor& conf_in, const torch::Tensor& pred_cls_in,
                        const torch::Tensor& target_cls_in) {
  constexpr double kEps = 1e-16;
  const int64_t kGrid = 1000;
  const auto nt = tp_in.size(1);
  auto order = std::get<1>(torch::sort(conf_in, /*stable=*/true, 0, /*descending=*/true));
  auto tp = tp_in.index({order}).to(torch::kLong);
  auto conf = conf_in.index({order}).to(torch::kDouble);
  auto pred_cls = pred_cls_in.index({order});

  // Classes present in the labels (ascending) and their label counts.
  auto all_counts = target_cls_in.numel() ? torch::bincount(target_cls_in.to(torch::kLong)) : torch::zeros({0}, kLong);
  auto classes = all_counts.nonzero().view({-1});
  auto counts = all_counts.index({classes});
  const auto nc = classes.size(0);

  ApPerClass out;
  out.x = unit_linspace(kGrid);
  out.ap = torch::zeros({nc, nt}, kDouble);
  out.p_curve = torch::zeros({nc, kGrid}, kDouble);
  out.r_curve = torch::zeros({nc, kGrid}, kDouble);
  std::vector<torch::Tensor> prec_values;
  auto neg_x = -out.x;
  for (int64_t ci = 0; ci < nc; ++ci) {
    auto sel = pred_cls == classes[ci];
    const auto n_l = counts[ci].item<int64_t>();
    if (n_l == 0 || !sel.any().item<bool>()) continue;
    auto tpc = tp.index({sel}).cumsum(0);  // (n_p, T)
    auto fpc = (1 - tp.index({sel})).cumsum(0);
    auto recall = tpc.to(torch::kDouble) / (static_cast<double>(n_l) + kEps);
    auto precision = tpc.to(torch::kDouble) / (tpc + fpc).to(torch::kDouble);
    auto neg_conf = -conf.index({sel});
    auto r0 = recall.select(1, 0);
    auto p0 = precision.select(1, 0);
    out.r_curve[ci].copy_(interp(neg_x, neg_conf, r0, 0.0, r0[-1].item<double>()));
    out.p_curve[ci].copy_(interp(neg_x, neg_conf, p0, 1.0, p0[-1].item<double>()));
    out.ap[ci].copy_(compute_ap(recall.t(), precision.t()));
    // Envelope at the first threshold over the recall grid, for PR plots.
    auto mrec = torch::cat({torch::zeros({1}, kDouble), r0, torch::ones({1}, kDouble)});
    auto mpre = torch::cat({torch::ones({1}, kDouble), p0, torch::zeros({1}, kDouble)});
    mpre = std::get<0>(mpre.flip(0).cummax(0)).flip(0);
    prec_values.push_back(interp(out.x, mrec, mpre, mpre[0].item<double>(), mpre[-1].item<double>()));
  }
  out.prec_values = prec_values.empty() ? torch::zeros({0, kGrid}, kDouble) : torch::stack(prec_values);
  out.f1_curve = 2 * out.p_curve * out.r_curve / (out.p_curve + out.r_curve + kEps);
  int64_t i = 0;
  if (nc > 0) i = smooth_curve(out.f1_curve.mean(0), 0.1).argmax().item<int64_t>();
  out.p = out.p_curve.select(1, i).contiguous();
  out.r = out.r_curve.select(1, i).contiguous();
  out.f1 = out.f1_curve.select(1, i).contiguous();
  out.tp = (out.r * counts.to(torch::kDouble)).round();
  out.fp = (out.tp / (out.p + kEps) - out.tp).round();
  out.classes = classes.to(torch::kLong);
  return out;
}

DetectionMetrics::DetectionMetrics(int64_t nc, torch::Tensor iou_thresholds)
    : nc_(nc), iouv_(std::move(iou_thresholds)) {
  if (nc_ < 1) throw std::invalid_argument("DetectionMetrics: nc must be >= 1");
  if (iouv_.dim() != 1 || iouv_.size(0) < 1) throw std::invalid_argument("DetectionMetrics: bad IoU thresholds");
}

void DetectionMetrics::reset() {
  images_ = 0;
  correct_.clear();
  conf_.clear();
  pred_cls_.clear();
  target_cls_.clear();
}

void DetectionMetrics::update(const torch::Tensor& detections_in, const torch::Tensor& labels_in) {
  auto det = detections_in.detach().to(torch::kCPU).to(torch::kFloat32);
  auto lab = labels_in.detach().to(torch::kCPU).to(torch::kFloat32);
  if (det.numel() == 0) det = det.reshape({0, 6});
  if (lab.numel() == 0) lab = lab.reshape({0, 5});
  if (det.dim() != 2 || det.size(1) != 6)
    throw std::invalid_argument("DetectionMetrics::update: detections must be (N, 6)");
  if (lab.dim() != 2 || lab.size(1) != 5)
    throw std::invalid_argument("DetectionMetrics::update: labels must be (M, 5)");
  if (lab.size(0) > 0) {
    auto cls = lab.select(1, 0);
    if (cls.min().item<double>() < 0 || cls.max().item<double>() >= static_cast<double>(nc_)) {
      throw std::invalid_argument("DetectionMetrics::update: label class outside [0, " + std::to_string(nc_) + ")");
    }
  }
  ++images_;
  correct_.push_back(match_detections(det, lab, iouv_));
  conf_.push_back(det.select(1, 4).clone());
  pred_cls_.push_back(det.select(1, 5).clone());
  target_cls_.push_back(lab.select(1, 0).clone());
}

DetectionResults DetectionMetrics::compute() const {
  DetectionResults res;
  res.images = images_;
  const auto nt = iouv_.size(0);
  auto correct = correct_.empty() ? torch::zeros({0, nt}, torch::kBool) : torch::cat(correct_);
  auto conf = conf_.empty() ? torch::zeros({0}) : torch::cat(conf_);
  auto pred_cls = pred_cls_.empty() ? torch::zeros({0}) : torch::cat(pred_cls_);
  auto target_cls = target_cls_.empty() ? torch::zeros({0}) : torch::cat(target_cls_);
  res.instances_per_class = torch::bincount(target_cls.to(torch::kLong), {}, nc_);
  // As the reference: nothing is computed unless at least one detection is correct somewhere.
  if (!correct.numel() || !correct.any().item<bool>()) return res;
  res.per_class = ap_per_class(correct, conf, pred_cls, target_cls);
  const auto& pc = res.per_class;
  const auto c = pc.classes.size(0);
  if (c > 0) {
    res.precision = pc.p.mean().item<double>();
    res.recall = pc.r.mean().item<double>();
    res.map50 = pc.ap.select(1, 0).mean().item<double>();
    res.map50_95 = pc.ap.mean().item<double>();
  }
  res.fitness = detection_fitness(res.map50, res.map50_95);
  auto ap50 = pc.ap.select(1, 0).contiguous();
  auto apm = pc.ap.mean(1).contiguous();
  for (int64_t i = 0; i < c; ++i) {
    res.class_index.push_back(pc.classes[i].item<int64_t>());
    res.class_p.push_back(pc.p[i].item<double>());
    res.class_r.push_back(pc.r[i].item<double>());
    res.class_ap50.push_back(ap50[i].item<double>());
    res.class_ap50_95.push_back(apm[i].item<double>());
  }
  return res;
}

std::string DetectionMetrics::format_table(const std::vector<std::string>& names) const {
  auto res = compute();
  std::string out;
  char buf[256];
  std::snprintf(buf, sizeof(buf), "%22s%11s%11s%11s%11s%11s%11s\n", "Class", "Images", "Instances", "Box(P", "R",
                "mAP50", "mAP50-95)");
  out += buf;
  const auto total = res.instances_per_class.sum().item<int64_t>();
  std::snprintf(buf, sizeof(buf), "%22s%11lld%11lld%11.3g%11.3g%11.3g%11.3g\n", "all",
                static_cast<long long>(res.images), static_cast<long long>(total), res.precision, res.recall, res.map50,
                res.map50_95);
  out += buf;
  for (size_t i = 0; i < res.class_index.size(); ++i) {
    const auto c = res.class_index[i];
    const std::string name =
        c >= 0 && static_cast<size_t>(c) < names.size() ? names[static_cast<size_t>(c)] : std::to_string(c);
    std::snprintf(buf, sizeof(buf), "%22s%11lld%11lld%11.3g%11.3g%11.3g%11.3g\n", name.c_str(),
                  static_cast<long long>(res.images),
                  static_cast<long long>(res.instances_per_class[c].item<int64_t>()), res.class_p[i], res.class_r[i],
                  res.class_ap50[i], res.class_ap50_95[i]);
    out += buf;
  }
  return out;
}

}  // namespace yolo8
