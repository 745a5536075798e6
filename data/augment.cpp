#include "data/augment.h"

#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

#include "data/pixel_kernels.h"

namespace yolo8::data {

// ---------------------------------------------------------------------------------------------------- Rng

namespace {
uint64_t splitmix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
// Python's round(): half to even, which std::nearbyint does in the default rounding mode.
int py_round(double v) { return static_cast<int>(std::nearbyint(v)); }
}  // namespace

uint64_t Rng::mix(uint64_t seed, uint64_t epoch, uint64_t index) {
  return splitmix(splitmix(splitmix(seed) ^ epoch) ^ (index * 0xD1B54A32D192ED03ull));
}

double Rng::uniform(double a, double b) {
  double u = static_cast<double>(gen_() >> 11) * 0x1.0p-53;
  return a + (b - a) * u;
}

int64_t Rng::randint(int64_t n) {
  if (n <= 1) return 0;
  return std::min<int64_t>(n - 1, static_cast<int64_t>(uniform() * static_cast<double>(n)));
}

double Rng::beta(double a, double b) {
  std::gamma_distribution<double> ga(a, 1.0), gb(b, 1.0);
  double x = ga(gen_), y = gb(gen_);
  return x / (x + y);
}

// ---------------------------------------------------------------------------------------------------- letterbox

cv::Mat letterbox(const cv::Mat& img, int out_h, int out_w, bool scaleup, LetterboxInfo* info, int pad_value) {
  if (img.empty() || out_h <= 0 || out_w <= 0) throw std::invalid_argument("letterbox: empty image or size");
  const int h = img.rows, w = img.cols;
  double r = std::min(static_cast<double>(out_h) / h, static_cast<double>(out_w) / w);
  if (!scaleup) r = std::min(r, 1.0);
  const int new_w = py_round(w * r), new_h = py_round(h * r);
  const double dw = (out_w - new_w) / 2.0, dh = (out_h - new_h) / 2.0;
  cv::Mat resized;
  if (new_w != w || new_h != h)
    cv::resize(img, resized, cv::Size(new_w, new_h), 0, 0, cv::INTER_LINEAR);
  else
    resized = img;
  // The +-0.1 splits an odd padding one pixel more to the bottom/right, as the reference does.
  const int top = py_round(dh - 0.1), bottom = py_round(dh + 0.1);
  const int left = py_round(dw - 0.1), right = py_round(dw + 0.1);
  cv::Mat out;
  cv::copyMakeBorder(resized, out, top, bottom, left, right, cv::BORDER_CONSTANT, cv::Scalar::all(pad_value));
  if (info) *info = LetterboxInfo{r, new_w, new_h, left, top, dw, dh};
  return out;
}

cv::Mat resize_long_side(const cv::Mat& img, int imgsz) {
  const int h0 = img.rows, w0 = img.cols;
  const double r = static_cast<double>(imgsz) / std::max(h0, w0);
  if (r == 1.0) return img;
  const int w = std::min(static_cast<int>(std::ceil(w0 * r)), imgsz);
  const int h = std::min(static_cast<int>(std::ceil(h0 * r)), imgsz);
  cv::Mat out;
  cv::resize(img, out, cv::Size(w, h), 0, 0, cv::INTER_LINEAR);
  return out;
}

std::vector<size_t> aspect_order(const std::vector<std::pair<int, int>>& hw) {
  std::vector<size_t> order(hw.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return static_cast<double>(hw[a].first) / hw[a].second < static_cast<double>(hw[b].first) / hw[b].second;
  });
  return order;
}

std::vector<std::pair<int, int>> rect_batch_shapes(const std::vector<std::pair<int, int>>& hw, int batch, int imgsz,
                                                   int stride, double pad) {
  std::vector<std::pair<int, int>> shapes;
  for (size_t start = 0; start < hw.size(); start += static_cast<size_t>(batch)) {
    size_t end = std::min(hw.size(), start + static_cast<size_t>(batch));
    double mini = 1e30, maxi = -1e30;
    for (size_t i = start; i < end; ++i) {
      double ar = static_cast<double>(hw[i].first) / hw[i].second;
      mini = std::min(mini, ar);
      maxi = std::max(maxi, ar);
    }
    double sh = 1.0, sw = 1.0;
    if (maxi < 1) {
      sh = maxi;
    } else if (mini > 1) {
      sw = 1.0 / mini;
    }
    auto side = [&](double s) { return static_cast<int>(std::ceil(s * imgsz / stride + pad)) * stride; };
    shapes.emplace_back(side(sh), side(sw));
  }
  return shapes;
}

// ---------------------------------------------------------------------------------------------------- mosaic

namespace {

// cv::flip in place; around the vertical axis 64 pixels at a time where the CPU can (cv::flip moves 3-byte pixels
// one by one: 0.55 ms at 640x640).
void flip_pixels(cv::Mat& img, bool lr, bool ud) {
  if (lr && img.type() == CV_8UC3 && avx512_vbmi_supported()) {
    for (int r = 0; r < img.rows; ++r) mirror_row_avx512(img.ptr<uchar>(r), img.cols);
    if (ud) cv::flip(img, img, 0);
    return;
  }
  if (lr || ud) cv::flip(img, img, lr && ud ? -1 : (lr ? 1 : 0));
}

// Where each tile lands on the 2s x 2s canvas.
struct Placement {
  cv::Rect dst, src;
  cv::Rect quadrant;  // the canvas quarter around the centre that dst lies in (dst may leave part of it unfilled)
};

// Draws the centre, places the tiles as the reference does and shifts/clips their boxes to the canvas.
void mosaic_plan(const Tile tiles[4], int s, Rng& rng, Placement pl[4], std::vector<PixBox>& boxes) {
  const int s2 = 2 * s;
  const int border = -s / 2;
  // Centre drawn in [s/2, 3s/2), as the reference's uniform(-border, 2s + border).
  const int xc = static_cast<int>(rng.uniform(-border, s2 + border));
  const int yc = static_cast<int>(rng.uniform(-border, s2 + border));
  boxes.clear();
  for (int i = 0; i < 4; ++i) {
    const int h = tiles[i].img->rows, w = tiles[i].img->cols;
    int x1a, y1a, x2a, y2a, x1b, y1b, x2b, y2b;
    if (i == 0) {
      x1a = std::max(xc - w, 0);
      y1a = std::max(yc - h, 0);
      x2a = xc;
      y2a = yc;
      x1b = w - (x2a - x1a);
      y1b = h - (y2a - y1a);
      x2b = w;
      y2b = h;
    } else if (i == 1) {
      x1a = xc;
      y1a = std::max(yc - h, 0);
      x2a = std::min(xc + w, s2);
      y2a = yc;
      x1b = 0;
      y1b = h - (y2a - y1a);
      x2b = std::min(w, x2a - x1a);
      y2b = h;
    } else if (i == 2) {
      x1a = std::max(xc - w, 0);
      y1a = yc;
      x2a = xc;
      y2a = std::min(s2, yc + h);
      x1b = w - (x2a - x1a);
      y1b = 0;
      x2b = w;
      y2b = std::min(y2a - y1a, h);
    } else {
      x1a = xc;
      y1a = yc;
      x2a = std::min(xc + w, s2);
      y2a = std::min(s2, yc + h);
      x1b = 0;
      y1b = 0;
      x2b = std::min(w, x2a - x1a);
      y2b = std::min(y2a - y1a, h);
    }
    pl[i].dst = cv::Rect(x1a, y1a, std::max(0, x2a - x1a), std::max(0, y2a - y1a));
    pl[i].quadrant = cv::Rect(i % 2 ? xc : 0, i < 2 ? 0 : yc, i % 2 ? s2 - xc : xc, i < 2 ? yc : s2 - yc);
    pl[i].src = cv::Rect(x1b, y1b, std::max(0, x2b - x1b), std::max(0, y2b - y1b));
    const float padw = static_cast<float>(x1a - x1b), padh = static_cast<float>(y1a - y1b);
    for (PixBox b : *tiles[i].boxes) {
      b.x1 = std::clamp(b.x1 + padw, 0.f, float(s2));
      b.x2 = std::clamp(b.x2 + padw, 0.f, float(s2));
      b.y1 = std::clamp(b.y1 + padh, 0.f, float(s2));
      b.y2 = std::clamp(b.y2 + padh, 0.f, float(s2));
      boxes.push_back(b);
    }
  }
}

// Renders only `roi` of the canvas: fill 114, then the parts of the tiles inside it.
void mosaic_render(const Tile tiles[4], const Placement pl[4], const cv::Rect& roi, cv::Mat& canvas) {
  canvas.create(roi.height, roi.width, CV_8UC3);
  // Fill 114 only where no tile lands: in each quarter, the bands above and below its tile and beside it (writing
  // the whole region first cost 0.1 ms at 640).
  for (int i = 0; i < 4; ++i) {
    const cv::Rect q = pl[i].quadrant & roi;
    if (q.empty()) continue;
    const cv::Rect t = pl[i].dst & q;
    const cv::Rect gaps[4] = {t.empty() ? q : cv::Rect(q.x, q.y, q.width, t.y - q.y),
                              t.empty() ? cv::Rect() : cv::Rect(q.x, t.br().y, q.width, q.br().y - t.br().y),
                              t.empty() ? cv::Rect() : cv::Rect(q.x, t.y, t.x - q.x, t.height),
                              t.empty() ? cv::Rect() : cv::Rect(t.br().x, t.y, q.br().x - t.br().x, t.height)};
    for (const cv::Rect& g : gaps)
      if (!g.empty()) canvas(g - roi.tl()).setTo(cv::Scalar::all(114));
  }
  for (int i = 0; i < 4; ++i) {
    const cv::Rect inter = pl[i].dst & roi;
    if (inter.empty()) continue;
    const cv::Rect src(pl[i].src.x + inter.x - pl[i].dst.x, pl[i].src.y + inter.y - pl[i].dst.y, inter.width,
                       inter.height);
    (*tiles[i].img)(src).copyTo(canvas(inter - roi.tl()));
  }
}

}  // namespace

void mosaic4(const Tile tiles[4], int imgsz, Rng& rng, cv::Mat& canvas, std::vector<PixBox>& boxes) {
  Placement pl[4];
  mosaic_plan(tiles, imgsz, rng, pl, boxes);
  mosaic_render(tiles, pl, cv::Rect(0, 0, 2 * imgsz, 2 * imgsz), canvas);
}

// ---------------------------------------------------------------------------------------------------- perspective

bool box_candidate(const PixBox& before, const PixBox& after, double scale, double wh_thr, double ar_thr,
                   double area_thr) {
  const double eps = 1e-16;
  const double w1 = (before.x2 - before.x1) * scale, h1 = (before.y2 - before.y1) * scale;
  const double w2 = after.x2 - after.x1, h2 = after.y2 - after.y1;
  const double ar = std::max(w2 / (h2 + eps), h2 / (w2 + eps));
  return w2 > wh_thr && h2 > wh_thr && w2 * h2 / (w1 * h1 + eps) > area_thr && ar < ar_thr;
}

namespace {

struct Warp {
  cv::Matx33d m_img;    // for pixel centres (cv::flip convention)
  cv::Matx33d m_box;    // for box edges
  cv::Matx33d m_plain;  // before the flips
  bool flip_lr = false, flip_ud = false;
  double scale = 1.0;
  int width = 0, height = 0;
  bool persp = false;
  bool needed = true;  // false: the identity, the image is copied
};

// Left-right / up-down flips of a width x height image as a matrix. Pixel centres flip as x -> W - 1 - x
// (cv::flip, `centres`), box edges as x -> W - x.
cv::Matx33d flip_matrix(bool flip_lr, bool flip_ud, int width, int height, bool centres) {
  cv::Matx33d flip = cv::Matx33d::eye();
  const int shift = centres ? 1 : 0;
  if (flip_lr) {
    flip(0, 0) = -1;
    flip(0, 2) = width - shift;
  }
  if (flip_ud) {
    flip(1, 1) = -1;
    flip(1, 2) = height - shift;
  }
  return flip;
}

// The reference's matrix M = T * S * R * P * C with its draws in the same order; flips folded in last.
Warp draw_warp(int in_w, int in_h, const AugmentConfig& cfg, int border, Rng& rng, bool flip_lr, bool flip_ud) {
  Warp w;
  w.height = in_h + 2 * border;
  w.width = in_w + 2 * border;
  cv::Matx33d center = cv::Matx33d::eye();
  center(0, 2) = -in_w / 2.0;
  center(1, 2) = -in_h / 2.0;
  cv::Matx33d persp_m = cv::Matx33d::eye();
  persp_m(2, 0) = rng.uniform(-cfg.perspective, cfg.perspective);
  persp_m(2, 1) = rng.uniform(-cfg.perspective, cfg.perspective);
  const double a = rng.uniform(-cfg.degrees, cfg.degrees) * CV_PI / 180.0;
  const double s = rng.uniform(1 - cfg.scale, 1 + cfg.scale);
  cv::Matx33d rot = cv::Matx33d::eye();
  rot(0, 0) = s * std::cos(a);
  rot(0, 1) = s * std::sin(a);
  rot(1, 0) = -s * std::sin(a);
  rot(1, 1) = s * std::cos(a);
  cv::Matx33d shear_m = cv::Matx33d::eye();
  shear_m(0, 1) = std::tan(rng.uniform(-cfg.shear, cfg.shear) * CV_PI / 180.0);
  shear_m(1, 0) = std::tan(rng.uniform(-cfg.shear, cfg.shear) * CV_PI / 180.0);
  cv::Matx33d trans = cv::Matx33d::eye();
  trans(0, 2) = rng.uniform(0.5 - cfg.translate, 0.5 + cfg.translate) * w.width;
  trans(1, 2) = rng.uniform(0.5 - cfg.translate, 0.5 + cfg.translate) * w.height;
  const cv::Matx33d m = trans * shear_m * rot * persp_m * center;
  w.m_img = flip_matrix(flip_lr, flip_ud, w.width, w.height, true) * m;
  w.m_box = flip_matrix(flip_lr, flip_ud, w.width, w.height, false) * m;
  w.m_plain = m;
  w.flip_lr = flip_lr;
  w.flip_ud = flip_ud;
  w.scale = s;
  w.persp = cfg.perspective > 0;
  w.needed = border != 0 || flip_lr || flip_ud || cv::norm(w.m_img - cv::Matx33d::eye(), cv::NORM_INF) > 0;
  return w;
}

void warp_pixels(const cv::Mat& in, const Warp& w, const cv::Matx33d& m_img, cv::Mat& out) {
  if (!w.needed) {
    in.copyTo(out);
  } else if (w.persp) {
    cv::warpPerspective(in, out, cv::Mat(m_img), cv::Size(w.width, w.height), cv::INTER_LINEAR, cv::BORDER_CONSTANT,
                        cv::Scalar::all(114));
  } else {
    cv::Matx23d affine(m_img(0, 0), m_img(0, 1), m_img(0, 2), m_img(1, 0), m_img(1, 1), m_img(1, 2));
    cv::warpAffine(in, out, cv::Mat(affine), cv::Size(w.width, w.height), cv::INTER_LINEAR, cv::BORDER_CONSTANT,
                   cv::Scalar::all(114));
  }
}

// Scale and translation only (the default recipe: degrees, shear and perspective 0) is a resize of the sampled
// region, about twice as fast as the general warp. The region's edges are snapped to whole output pixels, which
// moves the translation by under half a pixel and the scale by under 1/600; the boxes follow the snapped mapping.
bool axis_aligned(const Warp& w) {
  return w.needed && !w.persp && w.m_plain(0, 1) == 0 && w.m_plain(1, 0) == 0 && w.m_plain(0, 0) > 0 &&
         w.m_plain(1, 1) > 0;
}

// One axis of the resize: source pixels [src0, src1) of the input land on output pixels [dst0, dst1).
struct AxisSpan {
  int src0 = 0, src1 = 0, dst0 = 0, dst1 = 0;
  bool empty() const { return src1 <= src0 || dst1 <= dst0; }
  double gain() const { return static_cast<double>(dst1 - dst0) / (src1 - src0); }
};

// `gain` and `shift` map pixel centres (x_out = gain * x_in + shift); pixel i covers [i, i + 1) in edge coordinates.
AxisSpan plan_axis(double gain, double shift, int in_size, int out_size) {
  const double edge_shift = shift + 0.5 - 0.5 * gain;  // the same map for edges
  AxisSpan a;
  // Clamped in double first: a tiny gain (scale close to 1 - scale) puts these far outside int's range.
  a.src0 = static_cast<int>(std::clamp(std::floor(-edge_shift / gain), 0.0, static_cast<double>(in_size)));
  a.src1 = static_cast<int>(std::clamp(std::ceil((out_size - edge_shift) / gain), 0.0, static_cast<double>(in_size)));
  if (a.src1 <= a.src0) return {};
  a.dst0 = static_cast<int>(std::lround(edge_shift + gain * a.src0));
  a.dst1 = static_cast<int>(std::lround(edge_shift + gain * a.src1));
  if (a.dst1 <= a.dst0) return {};
  return a;
}

struct AxisPlan {
  AxisSpan x, y;
  cv::Rect src() const { return {x.src0, y.src0, x.src1 - x.src0, y.src1 - y.src0}; }
};

AxisPlan plan_axis_aligned(const Warp& w, int in_w, int in_h) {
  return {plan_axis(w.m_plain(0, 0), w.m_plain(0, 2), in_w, w.width),
          plan_axis(w.m_plain(1, 1), w.m_plain(1, 2), in_h, w.height)};
}

// The box matrix of the snapped mapping (edge coordinates), flips included.
cv::Matx33d axis_box_matrix(const Warp& w, const AxisPlan& plan) {
  cv::Matx33d m = cv::Matx33d::eye();
  if (!plan.x.empty() && !plan.y.empty()) {
    m(0, 0) = plan.x.gain();
    m(0, 2) = plan.x.dst0 - plan.x.gain() * plan.x.src0;
    m(1, 1) = plan.y.gain();
    m(1, 2) = plan.y.dst0 - plan.y.gain() * plan.y.src0;
  } else {
    m(0, 0) = m(1, 1) = 0;  // nothing of the input is visible: every box collapses and is dropped
  }
  return flip_matrix(w.flip_lr, w.flip_ud, w.width, w.height, false) * m;
}

// The snapped region may overhang the output by a pixel or two on each side. The output is a view into a buffer
// with this margin, so the resize writes straight into it and the overhang is simply never looked at.
constexpr int kResizeMargin = 2;

void make_output_with_margin(cv::Mat& out, int width, int height) {
  if (!out.empty() && out.size() == cv::Size(width, height) && out.type() == CV_8UC3) {
    cv::Size whole;
    cv::Point offset;
    out.locateROI(whole, offset);
    const cv::Size with_margin(width + 2 * kResizeMargin, height + 2 * kResizeMargin);
    if (whole == with_margin && offset == cv::Point(kResizeMargin, kResizeMargin)) return;
  }
  cv::Mat buffer(height + 2 * kResizeMargin, width + 2 * kResizeMargin, CV_8UC3);
  out = buffer(cv::Rect(kResizeMargin, kResizeMargin, width, height));
}

// `region` is input(plan.src()); the output is filled with 114 where the input does not reach.
void render_axis_aligned(const cv::Mat& region, const Warp& w, const AxisPlan& plan, cv::Mat& out) {
  make_output_with_margin(out, w.width, w.height);
  const cv::Rect full(0, 0, w.width, w.height);
  if (plan.x.empty() || plan.y.empty()) {
    out.setTo(cv::Scalar::all(114));
    return;
  }
  const cv::Rect dst(plan.x.dst0, plan.y.dst0, plan.x.dst1 - plan.x.dst0, plan.y.dst1 - plan.y.dst0);
  const cv::Rect visible = dst & full;
  if (visible != full) out.setTo(cv::Scalar::all(114));
  if (!visible.empty()) {
    const cv::Rect reach(-kResizeMargin, -kResizeMargin, w.width + 2 * kResizeMargin, w.height + 2 * kResizeMargin);
    if ((dst & reach) == dst) {
      cv::Mat whole = out;
      whole.adjustROI(kResizeMargin, kResizeMargin, kResizeMargin, kResizeMargin);
      cv::Mat target = whole(dst + cv::Point(kResizeMargin, kResizeMargin));
      cv::resize(region, target, dst.size(), 0, 0, cv::INTER_LINEAR);
    } else {
      thread_local cv::Mat resized;
      cv::resize(region, resized, dst.size(), 0, 0, cv::INTER_LINEAR);
      resized(visible - dst.tl()).copyTo(out(visible));
    }
  }
  flip_pixels(out, w.flip_lr, w.flip_ud);
}

void warp_boxes(std::vector<PixBox>& boxes, const Warp& w, const cv::Matx33d& m) {
  std::vector<PixBox> kept;
  kept.reserve(boxes.size());
  for (const PixBox& b : boxes) {
    const double xs[4] = {b.x1, b.x2, b.x1, b.x2}, ys[4] = {b.y1, b.y2, b.y2, b.y1};
    double x0 = 1e30, y0 = 1e30, x1 = -1e30, y1 = -1e30;
    for (int k = 0; k < 4; ++k) {
      double px = m(0, 0) * xs[k] + m(0, 1) * ys[k] + m(0, 2);
      double py = m(1, 0) * xs[k] + m(1, 1) * ys[k] + m(1, 2);
      if (w.persp) {
        double pz = m(2, 0) * xs[k] + m(2, 1) * ys[k] + m(2, 2);
        px /= pz;
        py /= pz;
      }
      x0 = std::min(x0, px);
      x1 = std::max(x1, px);
      y0 = std::min(y0, py);
      y1 = std::max(y1, py);
    }
    PixBox n{b.cls, static_cast<float>(std::clamp(x0, 0.0, double(w.width))),
             static_cast<float>(std::clamp(y0, 0.0, double(w.height))),
             static_cast<float>(std::clamp(x1, 0.0, double(w.width))),
             static_cast<float>(std::clamp(y1, 0.0, double(w.height)))};
    if (box_candidate(b, n, w.scale)) kept.push_back(n);
  }
  boxes.swap(kept);
}

}  // namespace

void random_perspective(const cv::Mat& in, std::vector<PixBox>& boxes, const AugmentConfig& cfg, int border, Rng& rng,
                        cv::Mat& out, bool flip_lr, bool flip_ud) {
  const Warp w = draw_warp(in.cols, in.rows, cfg, border, rng, flip_lr, flip_ud);
  if (axis_aligned(w)) {
    const AxisPlan plan = plan_axis_aligned(w, in.cols, in.rows);
    const cv::Rect src = plan.src();
    render_axis_aligned(src.empty() ? in : in(src), w, plan, out);
    warp_boxes(boxes, w, axis_box_matrix(w, plan));
    return;
  }
  warp_pixels(in, w, w.m_img, out);
  warp_boxes(boxes, w, w.m_box);
}

void mosaic_perspective(const Tile tiles[4], int imgsz, const AugmentConfig& cfg, Rng& rng, cv::Mat& canvas,
                        cv::Mat& out, std::vector<PixBox>& boxes, bool flip_lr, bool flip_ud) {
  const int s2 = 2 * imgsz;
  Placement pl[4];
  mosaic_plan(tiles, imgsz, rng, pl, boxes);
  const Warp w = draw_warp(s2, s2, cfg, -imgsz / 2, rng, flip_lr, flip_ud);
  if (axis_aligned(w)) {
    const AxisPlan plan = plan_axis_aligned(w, s2, s2);
    const cv::Rect src = plan.src();
    if (!src.empty()) mosaic_render(tiles, pl, src, canvas);
    render_axis_aligned(canvas, w, plan, out);
    warp_boxes(boxes, w, axis_box_matrix(w, plan));
    return;
  }
  cv::Rect roi(0, 0, s2, s2);
  if (!w.persp) {
    // The canvas pixels the output samples: the preimage of the output corners, plus the bilinear neighbours.
    const cv::Matx33d inv = w.m_img.inv();
    double x0 = 1e30, y0 = 1e30, x1 = -1e30, y1 = -1e30;
    for (double cx : {0.0, w.width - 1.0})
      for (double cy : {0.0, w.height - 1.0}) {
        const double px = inv(0, 0) * cx + inv(0, 1) * cy + inv(0, 2);
        const double py = inv(1, 0) * cx + inv(1, 1) * cy + inv(1, 2);
        x0 = std::min(x0, px);
        x1 = std::max(x1, px);
        y0 = std::min(y0, py);
        y1 = std::max(y1, py);
      }
    const int left = static_cast<int>(std::floor(std::max(x0 - 2, 0.0)));
    const int top = static_cast<int>(std::floor(std::max(y0 - 2, 0.0)));
    const int right = static_cast<int>(std::ceil(std::min(x1 + 3, double(s2))));
    const int bottom = static_cast<int>(std::ceil(std::min(y1 + 3, double(s2))));
    roi = cv::Rect(left, top, std::max(1, right - left), std::max(1, bottom - top)) & cv::Rect(0, 0, s2, s2);
    if (roi.empty()) roi = cv::Rect(0, 0, 1, 1);
  }
  mosaic_render(tiles, pl, roi, canvas);
  // Canvas-local coordinates: shift by the ROI's corner before the warp.
  cv::Matx33d shift = cv::Matx33d::eye();
  shift(0, 2) = roi.x;
  shift(1, 2) = roi.y;
  warp_pixels(canvas, w, w.m_img * shift, out);
  warp_boxes(boxes, w, w.m_box);
}

// ---------------------------------------------------------------------------------------------------- colour, flips

void augment_hsv(cv::Mat& img, double hgain, double sgain, double vgain, Rng& rng) {
  if (hgain <= 0 && sgain <= 0 && vgain <= 0) return;
  const double r0 = rng.uniform(-1, 1) * hgain + 1;
  const double r1 = rng.uniform(-1, 1) * sgain + 1;
  const double r2 = rng.uniform(-1, 1) * vgain + 1;
  HsvTables t;
  for (int x = 0; x < 256; ++x) {
    t.h[x] = static_cast<uchar>(std::fmod(x * r0, 180.0));
    t.s[x] = static_cast<uchar>(std::clamp(x * r1, 0.0, 255.0));
    t.v[x] = static_cast<uchar>(std::clamp(x * r2, 0.0, 255.0));
  }
  thread_local cv::Mat hsv;
  // The widest fused kernel this CPU runs (AVX-512 VBMI, else AVX2 + FMA), chosen once.
  static const auto fused = avx512_vbmi_supported() ? augment_hsv_avx512
                            : avx2_fma_supported()  ? augment_hsv_avx2
                                                    : nullptr;
  if (img.type() == CV_8UC3 && fused != nullptr) {
    // Both conversions and the tables in one vector pass in place, equal to the recipe below bit for bit
    // (tests/data/pixel_kernels_test.cpp): at 640x640, 0.37 instead of 1.5 ms with AVX-512 on a Zen 4, and 3.4 instead
    // of 4.1 ms with AVX2 on a Zen 1. The last cols % 64 pixels of every row take OpenCV's own path, as one
    // narrow image.
    int64_t done = 0;
    for (int r = 0; r < img.rows; ++r) done = fused(img.ptr<uchar>(r), img.cols, t);
    const int rest = img.cols - static_cast<int>(done);
    if (rest > 0) {
      hsv.create(img.rows, rest, CV_8UC3);
      for (int r = 0; r < img.rows; ++r)
        bgr_to_hsv_tables_scalar(img.ptr<uchar>(r) + 3 * done, hsv.ptr<uchar>(r), rest, t);
      cv::Mat tail = img(cv::Rect(static_cast<int>(done), 0, rest, img.rows));
      cv::cvtColor(hsv, tail, cv::COLOR_HSV2BGR);
    }
    return;
  }
  cv::cvtColor(img, hsv, cv::COLOR_BGR2HSV);
  // Three plain tables beat cv::LUT's interleaved 3-channel path by about 2x (0.28 vs 0.51 ms at 640x640).
  for (int r = 0; r < hsv.rows; ++r) {
    uchar* p = hsv.ptr<uchar>(r);
    for (int x = 0; x < hsv.cols; ++x, p += 3) {
      p[0] = t.h[p[0]];
      p[1] = t.s[p[1]];
      p[2] = t.v[p[2]];
    }
  }
  cv::cvtColor(hsv, img, cv::COLOR_HSV2BGR);
}

void flip_lr(cv::Mat& img, std::vector<PixBox>& boxes) {
  flip_pixels(img, true, false);
  const float w = static_cast<float>(img.cols);
  for (auto& b : boxes) {
    const float x1 = w - b.x2, x2 = w - b.x1;
    b.x1 = x1;
    b.x2 = x2;
  }
}

void flip_ud(cv::Mat& img, std::vector<PixBox>& boxes) {
  cv::flip(img, img, 0);
  const float h = static_cast<float>(img.rows);
  for (auto& b : boxes) {
    const float y1 = h - b.y2, y2 = h - b.y1;
    b.y1 = y1;
    b.y2 = y2;
  }
}

void mixup(cv::Mat& img, std::vector<PixBox>& boxes, const cv::Mat& other, const std::vector<PixBox>& other_boxes,
           Rng& rng) {
  if (other.size() != img.size() || other.type() != img.type())
    throw std::invalid_argument("mixup: images differ in size or type");
  const double r = rng.beta(32.0, 32.0);
  cv::addWeighted(img, r, other, 1.0 - r, 0.0, img);
  boxes.insert(boxes.end(), other_boxes.begin(), other_boxes.end());
}

}  // namespace yolo8::data
