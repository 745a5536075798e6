
#include "trainer/plots/plots.h"

#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <stdexcept>

#include "trainer/detect/box_ops.h"

namespace yolo8 {

namespace {

// Tableau-style categorical colours, then their lighter partners (RGB).
constexpr std::array<Rgb, 20> kPalette{{{31, 119, 180},  {255, 127, 14},  {44, 160, 44},   {214, 39, 40},
                                        {148, 103, 189}, {140, 86, 75},   {227, 119, 194}, {127, 127, 127},
                                        {188, 189, 34},  {23, 190, 207},  {174, 199, 232}, {255, 187, 120},
                                        {152, 223, 138}, {255, 152, 150}, {197, 176, 213}, {196, 156, 148},
                                        {247, 182, 210}, {199, 199, 199}, {219, 219, 141}, {158, 218, 229}}};

// ColorBrewer "Blues" from light to dark (RGB), for heat maps.
constexpr std::array<Rgb, 9> kBlues{{{247, 251, 255},
                                     {222, 235, 247},
                                     {198, 219, 239},
                                     {158, 202, 225},
                                     {107, 174, 214},
                                     {66, 146, 198},
                                     {33, 113, 181},
                                     {8, 81, 156},
                                     {8, 48, 107}}};

const cv::Scalar kWhite(255, 255, 255);
const cv::Scalar kBlack(0, 0, 0);
const cv::Scalar kText(40, 40, 40);
const cv::Scalar kAxis(90, 90, 90);
const cv::Scalar kGrid(232, 232, 232);
const cv::Scalar kGrey(170, 170, 170);
const cv::Scalar kMeanColor(140, 50, 10);  // deep blue (BGR) for the all-classes curve
constexpr int kFont = cv::FONT_HERSHEY_SIMPLEX;
constexpr int kShift = 4;  // sub-pixel bits for polylines
constexpr double kSub = 1 << kShift;

cv::Scalar bgr(Rgb c) { return cv::Scalar(c.b, c.g, c.r); }

cv::Scalar blues(double t) {
  t = std::clamp(t, 0.0, 1.0) * (kBlues.size() - 1);
  const auto i = std::min(static_cast<size_t>(t), kBlues.size() - 2);
  const double f = t - static_cast<double>(i);
  const auto& a = kBlues[i];
  const auto& b = kBlues[i + 1];
  return cv::Scalar(a.b + f * (b.b - a.b), a.g + f * (b.g - a.g), a.r + f * (b.r - a.r));
}

std::string fmt(double v, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

std::string class_name(const std::vector<std::string>& names, int64_t c) {
  return c >= 0 && c < static_cast<int64_t>(names.size()) ? names[c] : std::to_string(c);
}

std::string shorten(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(0, n - 2) + ".."; }

enum class HAlign { kLeft, kCenter, kRight };
enum class VAlign { kTop, kMiddle, kBottom };

cv::Size text_size(const std::string& text, double scale, int thickness = 1) {
  int baseline = 0;
  return cv::getTextSize(text, kFont, scale, thickness, &baseline);
}

// Text anchored at p with the given alignment (cap height used for vertical placement).
void put_text(cv::Mat& img, const std::string& text, cv::Point p, double scale, const cv::Scalar& color,
              int thickness = 1, HAlign h = HAlign::kLeft, VAlign v = VAlign::kBottom) {
  const auto sz = text_size(text, scale, thickness);
  int x = p.x, y = p.y;
  if (h == HAlign::kCenter) x -= sz.width / 2;
  if (h == HAlign::kRight) x -= sz.width;
  if (v == VAlign::kTop) y += sz.height;
  if (v == VAlign::kMiddle) y += sz.height / 2;
  cv::putText(img, text, {x, y}, kFont, scale, color, thickness, cv::LINE_AA);
}

// Text reading bottom to top, centred on c.
void put_text_vertical(cv::Mat& img, const std::string& text, cv::Point c, double scale, const cv::Scalar& color,
                       int thickness = 1) {
  int baseline = 0;
  const auto sz = cv::getTextSize(text, kFont, scale, thickness, &baseline);
  cv::Mat tile(sz.height + baseline + 4, sz.width + 4, CV_8UC3, kWhite);
  cv::putText(tile, text, {2, sz.height + 2}, kFont, scale, color, thickness, cv::LINE_AA);
  cv::Mat mask(tile.size(), CV_8UC1, cv::Scalar(255));
  cv::rotate(tile, tile, cv::ROTATE_90_COUNTERCLOCKWISE);
  cv::rotate(mask, mask, cv::ROTATE_90_COUNTERCLOCKWISE);
  cv::Rect r(c.x - tile.cols / 2, c.y - tile.rows / 2, tile.cols, tile.rows);
  const cv::Rect clipped = r & cv::Rect(0, 0, img.cols, img.rows);
  if (clipped.empty()) return;
  // Keep the background under the text: blend by darkness of the rendered glyphs.
  cv::Mat src = tile(clipped - r.tl());
  cv::Mat dst = img(clipped);
  cv::Mat gray;
  cv::cvtColor(src, gray, cv::COLOR_BGR2GRAY);
  cv::Mat alpha;
  gray.convertTo(alpha, CV_32F, -1.0 / 255.0, 1.0);
  cv::Mat src_f, dst_f;
  src.convertTo(src_f, CV_32FC3);
  dst.convertTo(dst_f, CV_32FC3);
  cv::Mat alpha3;
  cv::merge(std::vector<cv::Mat>{alpha, alpha, alpha}, alpha3);
  cv::Mat color_f(src.size(), CV_32FC3, color);
  cv::Mat out = dst_f.mul(cv::Scalar(1, 1, 1) - alpha3) + color_f.mul(alpha3);
  out.convertTo(dst, CV_8UC3);
}

// Rounded "nice" tick step covering [lo, hi] with about n intervals.
double nice_step(double lo, double hi, int n) {
  const double raw = (hi - lo) / std::max(n, 1);
  if (!(raw > 0) || !std::isfinite(raw)) return 1.0;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (m * mag >= raw) return m * mag;
  }
  return 10 * mag;
}

int decimals_for(double step) {
  if (step >= 1) return 0;
  int d = static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  // 2.5-type steps need one more digit.
  if (std::fabs(std::round(step * std::pow(10, d)) - step * std::pow(10, d)) > 1e-6) ++d;
  return std::min(d, 6);
}

struct Axes {
  cv::Rect box;  // plot area in pixels
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;

  cv::Point2d px(double x, double y) const {
    return {box.x + (x - x0) / (x1 - x0) * box.width, box.y + box.height - (y - y0) / (y1 - y0) * box.height};
  }
  cv::Point spx(double x, double y) const {  // sub-pixel fixed point for polylines
    const auto p = px(x, y);
    return {static_cast<int>(std::lround(p.x * kSub)), static_cast<int>(std::lround(p.y * kSub))};
  }
};

struct AxesStyle {
  std::string title, xlabel, ylabel;
  double font = 0.5;
  int xticks = 5, yticks = 5;
  bool x_tick_labels = true;  // off when the caller labels the x axis itself
  double min_xstep = 0;       // 1 for epochs: no fractional ticks
  double min_ystep = 0;       // 1 for counts
};

void draw_axes(cv::Mat& img, const Axes& ax, const AxesStyle& st) {
  const double fs = st.font;
  const auto& b = ax.box;
  const double xs = std::max(nice_step(ax.x0, ax.x1, st.xticks), st.min_xstep),
               ys = std::max(nice_step(ax.y0, ax.y1, st.yticks), st.min_ystep);
  const int xd = decimals_for(xs), yd = decimals_for(ys);
  for (double t = std::ceil(ax.x0 / xs - 1e-9) * xs; st.x_tick_labels && t <= ax.x1 + xs * 1e-6; t += xs) {
    const int x = static_cast<int>(std::lround(ax.px(t, ax.y0).x));
    cv::line(img, {x, b.y}, {x, b.y + b.height}, kGrid, 1, cv::LINE_AA);
    cv::line(img, {x, b.y + b.height}, {x, b.y + b.height + 5}, kAxis, 1, cv::LINE_AA);
    put_text(img, fmt(std::fabs(t) < xs * 1e-6 ? 0.0 : t, xd), {x, b.y + b.height + 9}, fs * 0.85, kText, 1,
             HAlign::kCenter, VAlign::kTop);
  }
  for (double t = std::ceil(ax.y0 / ys - 1e-9) * ys; t <= ax.y1 + ys * 1e-6; t += ys) {
    const int y = static_cast<int>(std::lround(ax.px(ax.x0, t).y));
    cv::line(img, {b.x, y}, {b.x + b.width, y}, kGrid, 1, cv::LINE_AA);
    cv::line(img, {b.x - 5, y}, {b.x, y}, kAxis, 1, cv::LINE_AA);
    put_text(img, fmt(std::fabs(t) < ys * 1e-6 ? 0.0 : t, yd), {b.x - 9, y}, fs * 0.85, kText, 1, HAlign::kRight,
             VAlign::kMiddle);
  }
  cv::rectangle(img, b, kAxis, 1, cv::LINE_AA);
  if (!st.title.empty())
    put_text(img, st.title, {b.x + b.width / 2, b.y - 12}, fs * 1.2, kBlack, 1, HAlign::kCenter, VAlign::kBottom);
  if (!st.xlabel.empty())
    put_text(img, st.xlabel, {b.x + b.width / 2, b.y + b.height + 9 + static_cast<int>(40 * fs * 1.8)}, fs, kText, 1,
             HAlign::kCenter, VAlign::kBottom);
  if (!st.ylabel.empty()) {
    const int w = text_size("0.000", fs * 0.85).width;
    put_text_vertical(img, st.ylabel, {b.x - w - 20 - static_cast<int>(12 * fs), b.y + b.height / 2}, fs, kText);
  }
}

// Polyline inside the plot area (clipped to it), skipping non-finite points.
void draw_curve(cv::Mat& img, const Axes& ax, const std::vector<double>& xs, const std::vector<double>& ys,
                const cv::Scalar& color, int thickness) {
  cv::Mat area = img(ax.box);
  Axes local = ax;
  local.box = cv::Rect(0, 0, ax.box.width, ax.box.height);
  std::vector<cv::Point> run;
  const auto flush = [&] {
    if (run.size() >= 2) cv::polylines(area, run, false, color, thickness, cv::LINE_AA, kShift);
    run.clear();
  };
  for (size_t i = 0; i < std::min(xs.size(), ys.size()); ++i) {
    if (!std::isfinite(xs[i]) || !std::isfinite(ys[i])) {
      flush();
      continue;
    }
    run.push_back(local.spx(xs[i], ys[i]));
  }
  flush();
}

void draw_dashed(cv::Mat& img, const Axes& ax, const std::vector<double>& xs, const std::vector<double>& ys,
                 const cv::Scalar& color, int thickness, double dash = 7, double gap = 5) {
  cv::Mat area = img(ax.box);
  Axes local = ax;
  local.box = cv::Rect(0, 0, ax.box.width, ax.box.height);
  double phase = 0;  // distance into the current dash+gap period
  for (size_t i = 1; i < std::min(xs.size(), ys.size()); ++i) {
    if (!std::isfinite(ys[i - 1]) || !std::isfinite(ys[i])) continue;
    auto a = local.px(xs[i - 1], ys[i - 1]);
    const auto b = local.px(xs[i], ys[i]);
    double len = cv::norm(b - a);
    const cv::Point2d dir = len > 0 ? (b - a) / len : cv::Point2d(0, 0);
    while (len > 1e-9) {
      const bool on = phase < dash;
      const double step = std::min(len, on ? dash - phase : dash + gap - phase);
      const auto e = a + dir * step;
      if (on)
        cv::line(area, cv::Point(cvRound(a.x * kSub), cvRound(a.y * kSub)),
                 cv::Point(cvRound(e.x * kSub), cvRound(e.y * kSub)), color, thickness, cv::LINE_AA, kShift);
      phase = std::fmod(phase + step, dash + gap);
      len -= step;
      a = e;
    }
  }
}

void draw_markers(cv::Mat& img, const Axes& ax, const std::vector<double>& xs, const std::vector<double>& ys,
                  const cv::Scalar& color, int radius) {
  cv::Mat area = img(ax.box);
  Axes local = ax;
  local.box = cv::Rect(0, 0, ax.box.width, ax.box.height);
  for (size_t i = 0; i < std::min(xs.size(), ys.size()); ++i) {
    if (!std::isfinite(ys[i])) continue;
    cv::circle(area, local.spx(xs[i], ys[i]), radius * static_cast<int>(kSub), color, -1, cv::LINE_AA, kShift);
  }
}

struct LegendEntry {
  std::string label;
  cv::Scalar color;
  int thickness = 2;
  bool dashed = false;
  bool marker = false;
};

// Legend box with its top-left corner at p (or its top-right corner when right_align); entries stacked, or
// side by side when horizontal.
void draw_legend(cv::Mat& img, cv::Point p, const std::vector<LegendEntry>& entries, double fs, bool right_align,
                 bool horizontal = false) {
  if (entries.empty()) return;
  const int row = static_cast<int>(std::lround(fs * 44)), swatch = static_cast<int>(std::lround(fs * 56));
  std::vector<int> widths;
  int w = 0, sum = 0;
  for (const auto& e : entries) {
    widths.push_back(text_size(e.label, fs).width + swatch + 30);
    w = std::max(w, widths.back());
    sum += widths.back();
  }
  const int n = static_cast<int>(entries.size());
  const int bw = horizontal ? sum : w, bh = (horizontal ? row : row * n) + 12;
  if (right_align) p.x -= bw;
  const cv::Rect box(p.x, p.y, bw, bh);
  img(box & cv::Rect(0, 0, img.cols, img.rows)).setTo(kWhite);
  cv::rectangle(img, box, cv::Scalar(210, 210, 210), 1, cv::LINE_AA);
  int x0 = p.x;
  for (int i = 0; i < n; ++i) {
    const auto& e = entries[i];
    const int y = p.y + 6 + (horizontal ? 0 : row * i) + row / 2;
    const cv::Point a(x0 + 10, y), b(x0 + 10 + swatch, y);
    if (horizontal) x0 += widths[i];
    if (e.dashed) {
      for (int x = a.x; x < b.x; x += 12)
        cv::line(img, {x, y}, {std::min(x + 7, b.x), y}, e.color, e.thickness, cv::LINE_AA);
    } else {
      cv::line(img, a, b, e.color, e.thickness, cv::LINE_AA);
    }
    if (e.marker) cv::circle(img, (a + b) / 2, 4, e.color, -1, cv::LINE_AA);
    put_text(img, e.label, {b.x + 10, y}, fs, kText, 1, HAlign::kLeft, VAlign::kMiddle);
  }
}

void write_image(const std::string& path, const cv::Mat& img) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto parent = fs::path(path).parent_path();
  if (!parent.empty()) fs::create_directories(parent, ec);
  bool ok = false;
  try {
    ok = cv::imwrite(path, img);
  } catch (const cv::Exception& e) {
    throw std::runtime_error("cannot write plot '" + path + "': " + e.what());
  }
  if (!ok) throw std::runtime_error("cannot write plot '" + path + "' (unknown extension or unwritable folder)");
}

cv::Mat canvas(PlotSize s) { return cv::Mat(s.height, s.width, CV_8UC3, kWhite); }

std::vector<double> to_vec(const torch::Tensor& t) {
  auto c = t.detach().to(torch::kCPU, torch::kDouble).contiguous().reshape({-1});
  const double* p = c.data_ptr<double>();
  return std::vector<double>(p, p + c.numel());
}

// ---------------------------------------------------------------------------------------------------------
// results.csv

std::string trim(const std::string& s) {
  const auto a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  const auto b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  std::istringstream ss(line);
  while (std::getline(ss, cell, ',')) out.push_back(trim(cell));
  if (!line.empty() && line.back() == ',') out.emplace_back();
  return out;
}

struct Csv {
  std::vector<std::string> header;
  std::vector<std::vector<double>> cols;  // by header column
};

Csv read_results_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("results file '" + path + "' cannot be opened");
  Csv csv;
  std::string line;
  if (!std::getline(in, line) || trim(line).empty())
    throw std::runtime_error("results file '" + path + "' is empty (no header line)");
  csv.header = split_csv(line);
  csv.cols.assign(csv.header.size(), {});
  int line_no = 1;
  while (std::getline(in, line)) {
    ++line_no;
    if (trim(line).empty()) continue;
    const auto cells = split_csv(line);
    if (cells.size() != csv.header.size()) {
      throw std::runtime_error("results file '" + path + "' line " + std::to_string(line_no) + ": " +
                               std::to_string(cells.size()) + " fields, header has " +
                               std::to_string(csv.header.size()));
    }
    for (size_t j = 0; j < cells.size(); ++j) {
      char* end = nullptr;
      const double v = std::strtod(cells[j].c_str(), &end);
      if (cells[j].empty() || end == nullptr || *end != '\0') {
        throw std::runtime_error("results file '" + path + "' line " + std::to_string(line_no) + ": column '" +
                                 csv.header[j] + "' is not a number: '" + cells[j] + "'");
      }
      csv.cols[j].push_back(v);
    }
  }
  if (csv.cols.empty() || csv.cols[0].empty()) throw std::runtime_error("results file '" + path + "' has no data rows");
  return csv;
}

// Gaussian filter, sigma in samples, mirrored edges (as scipy's 'reflect'), truncated at 4 sigma.
std::vector<double> gaussian_smooth(const std::vector<double>& y, double sigma) {
  const int n = static_cast<int>(y.size());
  const int r = static_cast<int>(std::lround(4 * sigma));  // scipy's int(4 * sigma + 0.5) for sigma >= 0
  std::vector<double> k(2 * r + 1);
  double ks = 0;
  for (int i = -r; i <= r; ++i) ks += k[i + r] = std::exp(-0.5 * i * i / (sigma * sigma));
  std::vector<double> out(n, 0.0);
  for (int i = 0; i < n; ++i) {
    double s = 0;
    for (int j = -r; j <= r; ++j) {
      int m = ((i + j) % (2 * n) + 2 * n) % (2 * n);
      if (m >= n) m = 2 * n - 1 - m;
      s += k[j + r] * y[m];
    }
    out[i] = s / ks;
  }
  return out;
}

// Data range padded a little, never empty.
std::pair<double, double> padded_range(const std::vector<double>& v) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double x : v) {
    if (!std::isfinite(x)) continue;
    lo = std::min(lo, x);
    hi = std::max(hi, x);
  }
  if (!std::isfinite(lo)) return {0.0, 1.0};
  if (hi - lo < 1e-12) {
    const double d = std::max(std::fabs(hi) * 0.05, 1e-3);
    return {lo - d, hi + d};
  }
  const double pad = (hi - lo) * 0.06;
  return {lo - pad, hi + pad};
}

// ---------------------------------------------------------------------------------------------------------
// Metric curves

void plot_metric_curve(const std::string& png_path, const ApPerClass& stats, const torch::Tensor& curves,
                       const std::vector<std::string>& names, const std::string& xlabel, const std::string& ylabel,
                       bool pr) {
  auto img = canvas(kCurvePlotSize);
  Axes ax;
  ax.box = cv::Rect(110, 70, 900, 740);
  AxesStyle st;
  st.title = pr ? "Precision-Recall Curve" : ylabel + "-Confidence Curve";
  st.xlabel = xlabel;
  st.ylabel = ylabel;
  st.font = 0.7;
  draw_axes(img, ax, st);

  std::vector<LegendEntry> legend;
  const bool have = curves.defined() && curves.dim() == 2 && curves.size(0) > 0 && stats.x.defined() &&
                    stats.x.numel() == curves.size(1);
  if (!have) {
    put_text(img, "no detections or labels to plot", {ax.box.x + ax.box.width / 2, ax.box.y + ax.box.height / 2}, 0.8,
             kGrey, 1, HAlign::kCenter, VAlign::kMiddle);
    write_image(png_path, img);
    return;
  }
  const auto xs = to_vec(stats.x);
  const int64_t nc = curves.size(0);
  const bool per_class_legend = nc < 21;
  const auto classes =
      stats.classes.defined() && stats.classes.numel() == nc ? to_vec(stats.classes) : std::vector<double>();
  const auto ap50 = pr && stats.ap.defined() && stats.ap.dim() == 2 && stats.ap.size(0) == nc
                        ? to_vec(stats.ap.select(1, 0))
                        : std::vector<double>();
  for (int64_t c = 0; c < nc; ++c) {
    const auto ys = to_vec(curves[c]);
    const int64_t cls = classes.empty() ? c : static_cast<int64_t>(classes[c]);
    if (per_class_legend) {
      const auto color = bgr(class_color(cls));
      draw_curve(img, ax, xs, ys, color, 2);
      std::string label = shorten(class_name(names, cls), 24);
      if (!ap50.empty()) label += " " + fmt(ap50[c], 3);
      legend.push_back({label, color, 2});
    } else {
      draw_curve(img, ax, xs, ys, kGrey, 1);
    }
  }
  std::string mean_label;
  if (pr) {
    const auto mean = to_vec(curves.mean(0));
    draw_curve(img, ax, xs, mean, kMeanColor, 5);
    const double map50 = ap50.empty() ? 0.0 : stats.ap.select(1, 0).mean().item<double>();
    mean_label = "all classes " + fmt(map50, 3) + " mAP@0.5";
  } else {
    const auto smooth = smooth_curve(curves.mean(0), 0.05);
    const auto ys = to_vec(smooth);
    draw_curve(img, ax, xs, ys, kMeanColor, 5);
    const auto i = smooth.argmax().item<int64_t>();
    mean_label = "all classes " + fmt(ys[i], 2) + " at " + fmt(xs[i], 3);
  }
  if (!per_class_legend) legend.insert(legend.begin(), {std::to_string(nc) + " classes", kGrey, 1});
  legend.push_back({mean_label, kMeanColor, 5});
  draw_legend(img, {ax.box.x + ax.box.width + 30, ax.box.y}, legend, 0.55, false);
  write_image(png_path, img);
}

// Heat map of a (rows, cols) matrix into rect; NaN cells stay white.
void draw_heat(cv::Mat& img, const cv::Rect& rect, const torch::Tensor& values, double vmax) {
  const auto v = values.to(torch::kDouble).contiguous();
  const int64_t rows = v.size(0), cols = v.size(1);
  cv::Mat small(static_cast<int>(rows), static_cast<int>(cols), CV_8UC3, kWhite);
  const double* p = v.data_ptr<double>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const double x = p[r * cols + c];
      if (std::isfinite(x)) {
        const auto col = blues(vmax > 0 ? x / vmax : 0.0);
        small.at<cv::Vec3b>(static_cast<int>(r), static_cast<int>(c)) = cv::Vec3b(
            cv::saturate_cast<uint8_t>(col[0]), cv::saturate_cast<uint8_t>(col[1]), cv::saturate_cast<uint8_t>(col[2]));
      }
    }
  }
  cv::Mat big;
  cv::resize(small, big, rect.size(), 0, 0, cv::INTER_NEAREST);
  big.copyTo(img(rect));
}

void draw_colorbar(cv::Mat& img, const cv::Rect& rect, double vmax, int decimals, double fs) {
  for (int y = 0; y < rect.height; ++y) {
    const double t = 1.0 - static_cast<double>(y) / std::max(rect.height - 1, 1);
    cv::line(img, {rect.x, rect.y + y}, {rect.x + rect.width - 1, rect.y + y}, blues(t), 1);
  }
  cv::rectangle(img, rect, kAxis, 1);
  const double step = nice_step(0, vmax, 5);
  const int d = std::max(decimals_for(step), decimals);
  for (double t = 0; t <= vmax + step * 1e-6; t += step) {
    const int y = rect.y + rect.height - static_cast<int>(std::lround(t / vmax * rect.height));
    cv::line(img, {rect.x + rect.width, y}, {rect.x + rect.width + 5, y}, kAxis, 1);
    put_text(img, fmt(t, d), {rect.x + rect.width + 9, y}, fs, kText, 1, HAlign::kLeft, VAlign::kMiddle);
  }
}

// (bins, bins) counts of points (x, y) in [0, 1]^2, row 0 at the top (high y).
torch::Tensor histogram2d(const torch::Tensor& x, const torch::Tensor& y, int64_t bins) {
  const auto ix = (x * bins).floor().clamp(0, bins - 1).to(torch::kLong);
  const auto iy = (y * bins).floor().clamp(0, bins - 1).to(torch::kLong);
  const auto flat = (bins - 1 - iy) * bins + ix;
  return torch::bincount(flat, {}, bins * bins).reshape({bins, bins}).to(torch::kDouble);
}

void draw_density(cv::Mat& img, const Axes& ax, const torch::Tensor& x, const torch::Tensor& y, const AxesStyle& st) {
  if (x.numel() > 0) {
    auto h = histogram2d(x, y, 50);
    // log scale so that sparse regions stay visible; empty bins are white.
    auto v = torch::log1p(h);
    v = torch::where(h > 0, v, torch::full_like(v, std::numeric_limits<double>::quiet_NaN()));
    const double vmax = std::max(v.nan_to_num(0).max().item<double>(), 1e-9);
    // Lightest shades are kept for empty space: start at 25% of the ramp.
    v = v / vmax * 0.75 + 0.25;
    draw_heat(img, ax.box, v, 1.0);
  }
  draw_axes(img, ax, st);
}

}  // namespace

Rgb class_color(int64_t cls) {
  const auto n = static_cast<int64_t>(kPalette.size());
  return kPalette[((cls % n) + n) % n];
}

// ---------------------------------------------------------------------------------------------------------

void plot_results_csv(const std::string& csv_path, const std::string& png_path) {
  const auto csv = read_results_csv(csv_path);
  static const std::array<const char*, 10> kColumns{
      "train/box_loss", "train/cls_loss", "train/dfl_loss", "metrics/precision(B)", "metrics/recall(B)",
      "val/box_loss",   "val/cls_loss",   "val/dfl_loss",   "metrics/mAP50(B)",     "metrics/mAP50-95(B)"};
  const auto find = [&](const std::string& name) -> int {
    for (size_t j = 0; j < csv.header.size(); ++j)
      if (csv.header[j] == name) return static_cast<int>(j);
    return -1;
  };
  std::vector<int> idx;
  for (const char* c : kColumns) {
    const int j = find(c);
    if (j < 0) throw std::runtime_error("results file '" + csv_path + "' has no column '" + c + "'");
    idx.push_back(j);
  }
  const int ep = find("epoch");
  const size_t n = csv.cols[0].size();
  std::vector<double> xs(n);
  for (size_t i = 0; i < n; ++i) xs[i] = ep >= 0 ? csv.cols[ep][i] : static_cast<double>(i + 1);

  auto img = canvas(kResultsPlotSize);
  const int band = 34;  // figure-level legend above the panels
  const int pw = kResultsPlotSize.width / 5, ph = (kResultsPlotSize.height - band) / 2;
  const cv::Scalar raw = bgr(kPalette[0]), smooth = bgr(kPalette[1]);
  auto [xlo, xhi] = padded_range(xs);
  if (n == 1) xlo = xs[0] - 1, xhi = xs[0] + 1;
  for (int k = 0; k < 10; ++k) {
    const int r = k / 5, c = k % 5;
    Axes ax;
    ax.box = cv::Rect(c * pw + 72, band + r * ph + 40, pw - 92, ph - 92);
    const auto& ys = csv.cols[idx[k]];
    std::tie(ax.y0, ax.y1) = padded_range(ys);
    ax.x0 = xlo;
    ax.x1 = xhi;
    AxesStyle st;
    st.title = kColumns[k];
    st.xlabel = r == 1 ? "epoch" : "";
    st.font = 0.5;
    st.xticks = 4;
    st.min_xstep = 1;
    draw_axes(img, ax, st);
    draw_curve(img, ax, xs, ys, raw, 2);
    draw_markers(img, ax, xs, ys, raw, n > 60 ? 2 : 3);
    if (n >= 3) draw_dashed(img, ax, xs, gaussian_smooth(ys, 3.0), smooth, 2);
  }
  draw_legend(img, {kResultsPlotSize.width - 20, 6},
              {{"results", raw, 2, false, true}, {"smooth (gaussian, sigma 3)", smooth, 2, true, false}}, 0.45, true,
              true);
  write_image(png_path, img);
}

void plot_pr_curve(const std::string& png_path, const ApPerClass& stats, const std::vector<std::string>& names) {
  plot_metric_curve(png_path, stats, stats.prec_values, names, "Recall", "Precision", true);
}

void plot_f1_curve(const std::string& png_path, const ApPerClass& stats, const std::vector<std::string>& names) {
  plot_metric_curve(png_path, stats, stats.f1_curve, names, "Confidence", "F1", false);
}

void plot_p_curve(const std::string& png_path, const ApPerClass& stats, const std::vector<std::string>& names) {
  plot_metric_curve(png_path, stats, stats.p_curve, names, "Confidence", "Precision", false);
}

void plot_r_curve(const std::string& png_path, const ApPerClass& stats, const std::vector<std::string>& names) {
  plot_metric_curve(png_path, stats, stats.r_curve, names, "Confidence", "Recall", false);
}

void plot_confusion_matrix(const std::string& png_path, const torch::Tensor& matrix,
                           const std::vector<std::string>& names, bool normalize) {
  if (!matrix.defined() || matrix.dim() != 2 || matrix.size(0) != matrix.size(1) || matrix.size(0) < 2) {
    throw std::invalid_argument("plot_confusion_matrix('" + png_path + "'): matrix must be (nc + 1, nc + 1)");
  }
  const int64_t n = matrix.size(0), nc = n - 1;
  auto m = matrix.detach().to(torch::kCPU, torch::kDouble);
  if (normalize) m = m / (m.sum(0, true) + 1e-9);
  // Near-zero cells are left blank rather than printed as 0.00.
  m = torch::where(m < 0.005, torch::full_like(m, std::numeric_limits<double>::quiet_NaN()), m);
  const double vmax = std::max(m.nan_to_num(0).max().item<double>(), normalize ? 1e-9 : 1.0);

  const bool use_names = static_cast<int64_t>(names.size()) == nc && nc < 99;
  std::vector<std::string> ticks;
  for (int64_t i = 0; i < n; ++i)
    ticks.push_back(i == nc ? "background" : use_names ? shorten(names[i], 18) : std::to_string(i));

  auto img = canvas(kConfusionPlotSize);
  const double tfs = nc < 30 ? 0.55 : nc < 60 ? 0.4 : 0.3;
  int tick_w = 0;
  for (const auto& t : ticks) tick_w = std::max(tick_w, text_size(t, tfs).width);
  const int left = tick_w + 80, top = 80;
  const int room_h = kConfusionPlotSize.height - top - tick_w - 70;
  const int size = std::min(kConfusionPlotSize.width - left - 170, room_h);
  const int cell = size / static_cast<int>(n);
  const int side = cell * static_cast<int>(n);
  // Centre the figure vertically when the width limits it.
  const cv::Rect area(left, top + std::max(0, room_h - side) / 2, side, side);
  draw_heat(img, area, m, vmax);
  cv::rectangle(img, area, kAxis, 1);

  const bool vertical = tick_w > cell - 4;
  for (int64_t i = 0; i < n; ++i) {
    const int c = static_cast<int>(i) * cell + cell / 2;
    put_text(img, ticks[i], {area.x - 8, area.y + c}, tfs, kText, 1, HAlign::kRight, VAlign::kMiddle);
    if (vertical) {
      const int th = text_size(ticks[i], tfs).width;
      put_text_vertical(img, ticks[i], {area.x + c, area.y + area.height + 8 + th / 2}, tfs, kText);
    } else {
      put_text(img, ticks[i], {area.x + c, area.y + area.height + 8}, tfs, kText, 1, HAlign::kCenter, VAlign::kTop);
    }
  }
  if (nc < 30) {
    const auto mv = m.contiguous();
    const double* p = mv.data_ptr<double>();
    const double fs = std::clamp(cell / 90.0, 0.3, 0.7);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < n; ++c) {
        const double v = p[r * n + c];
        if (!std::isfinite(v)) continue;
        const auto bg = blues(v / vmax);
        const double lum = 0.114 * bg[0] + 0.587 * bg[1] + 0.299 * bg[2];
        put_text(img, fmt(v, normalize ? 2 : 0),
                 {area.x + static_cast<int>(c) * cell + cell / 2, area.y + static_cast<int>(r) * cell + cell / 2}, fs,
                 lum < 120 ? kWhite : kText, 1, HAlign::kCenter, VAlign::kMiddle);
      }
    }
  }
  const int xl_y = area.y + area.height + 8 + (vertical ? tick_w : 20) + 36;
  put_text(img, "True", {area.x + area.width / 2, xl_y}, 0.7, kBlack, 1, HAlign::kCenter, VAlign::kBottom);
  put_text_vertical(img, "Predicted", {area.x - tick_w - 40, area.y + area.height / 2}, 0.7, kBlack);
  put_text(img, normalize ? "Confusion Matrix Normalized" : "Confusion Matrix", {area.x + area.width / 2, area.y - 30},
           0.9, kBlack, 2, HAlign::kCenter, VAlign::kBottom);
  draw_colorbar(img, cv::Rect(area.x + area.width + 30, area.y, 24, area.height), vmax, normalize ? 1 : 0, 0.5);
  write_image(png_path, img);
}

void plot_labels(const std::string& png_path, const torch::Tensor& labels, const std::vector<std::string>& names) {
  if (labels.defined() && labels.numel() > 0 && (labels.dim() != 2 || labels.size(1) != 5)) {
    throw std::invalid_argument("plot_labels('" + png_path + "'): labels must be (N, 5) cls, cx, cy, w, h");
  }
  const auto lb = labels.defined() && labels.numel() > 0 ? labels.detach().to(torch::kCPU, torch::kDouble)
                                                         : torch::zeros({0, 5}, torch::kDouble);
  const auto cls = lb.select(1, 0).to(torch::kLong).clamp_min(0);
  if (cls.numel() > 0 && cls.max().item<int64_t>() >= 100000) {
    throw std::invalid_argument("plot_labels('" + png_path + "'): class index " +
                                std::to_string(cls.max().item<int64_t>()) + " is not plausible");
  }
  const int64_t nc =
      std::max<int64_t>(static_cast<int64_t>(names.size()), cls.numel() ? cls.max().item<int64_t>() + 1 : 1);
  auto img = canvas(kLabelsPlotSize);
  const int pw = kLabelsPlotSize.width / 2, ph = kLabelsPlotSize.height / 2;

  // Instances per class.
  {
    const auto counts = to_vec(torch::bincount(cls, {}, nc));
    Axes ax;
    ax.box = cv::Rect(100, 60, pw - 140, ph - 190);
    ax.x0 = -0.5;
    ax.x1 = static_cast<double>(nc) - 0.5;
    ax.y0 = 0;
    ax.y1 = std::max(1.0, *std::max_element(counts.begin(), counts.end()) * 1.08);
    AxesStyle st;
    st.title = "Instances per class (" + std::to_string(lb.size(0)) + " labels)";
    st.ylabel = "instances";
    st.font = 0.55;
    st.x_tick_labels = false;  // class names below
    st.min_ystep = 1;
    draw_axes(img, ax, st);
    const double bw = std::max(1.0, ax.box.width / static_cast<double>(nc) * 0.8);
    for (int64_t c = 0; c < nc; ++c) {
      const auto top = ax.px(static_cast<double>(c), counts[c]);
      const auto base = ax.px(static_cast<double>(c), 0);
      cv::rectangle(img, cv::Point(cvRound(top.x - bw / 2), cvRound(top.y)),
                    cv::Point(cvRound(top.x + bw / 2), cvRound(base.y) - 1), bgr(class_color(c)), -1);
    }
    cv::rectangle(img, ax.box, kAxis, 1, cv::LINE_AA);
    const int every = static_cast<int>(std::ceil(nc / 30.0));
    const double fs = nc <= 10 ? 0.5 : 0.4;
    for (int64_t c = 0; c < nc; c += every) {
      const auto p = ax.px(static_cast<double>(c), 0);
      const auto label = nc <= 30 ? shorten(class_name(names, c), 16) : std::to_string(c);
      const int tw = text_size(label, fs).width;
      if (nc <= 6 && tw < ax.box.width / nc)
        put_text(img, label, {cvRound(p.x), ax.box.y + ax.box.height + 10}, fs, kText, 1, HAlign::kCenter,
                 VAlign::kTop);
      else
        put_text_vertical(img, label, {cvRound(p.x), ax.box.y + ax.box.height + 10 + tw / 2}, fs, kText);
    }
  }
  // Box shapes, centred.
  {
    const cv::Rect box(pw + 60, 60, pw - 120, ph - 120);
    cv::Mat layer(box.size(), CV_8UC3, kWhite);
    const int64_t k = std::min<int64_t>(lb.size(0), 1000);
    const auto sel = lb.narrow(0, 0, k).contiguous();
    const double* p = sel.data_ptr<double>();
    for (int64_t i = 0; i < k; ++i) {
      const double w = p[i * 5 + 3] * box.width, h = p[i * 5 + 4] * box.height;
      const cv::Point2d c(box.width / 2.0, box.height / 2.0);
      cv::rectangle(layer, cv::Point(cvRound((c.x - w / 2) * kSub), cvRound((c.y - h / 2) * kSub)),
                    cv::Point(cvRound((c.x + w / 2) * kSub), cvRound((c.y + h / 2) * kSub)),
                    bgr(class_color(static_cast<int64_t>(p[i * 5]))), 1, cv::LINE_AA, kShift);
    }
    cv::addWeighted(layer, 0.6, cv::Mat(box.size(), CV_8UC3, kWhite), 0.4, 0, img(box));
    cv::rectangle(img, box, cv::Scalar(210, 210, 210), 1);
    put_text(img, "Box shapes (first " + std::to_string(k) + ", centred)", {box.x + box.width / 2, box.y - 12}, 0.66,
             kBlack, 1, HAlign::kCenter, VAlign::kBottom);
  }
  // Centre and size densities.
  {
    Axes ax;
    ax.box = cv::Rect(100, ph + 60, pw - 160, ph - 140);
    AxesStyle st;
    st.title = "Box centres";
    st.xlabel = "x";
    st.ylabel = "y";
    st.font = 0.55;
    draw_density(img, ax, lb.select(1, 1), lb.select(1, 2), st);
    ax.box.x += pw;
    st.title = "Box sizes";
    st.xlabel = "width";
    st.ylabel = "height";
    draw_density(img, ax, lb.select(1, 3), lb.select(1, 4), st);
  }
  write_image(png_path, img);
}

void plot_labels_correlogram(const std::string& png_path, const torch::Tensor& labels) {
  if (labels.defined() && labels.numel() > 0 && (labels.dim() != 2 || labels.size(1) != 5)) {
    throw std::invalid_argument("plot_labels_correlogram('" + png_path + "'): labels must be (N, 5) cls, cx, cy, w, h");
  }
  const auto lb = labels.defined() && labels.numel() > 0 ? labels.detach().to(torch::kCPU, torch::kDouble)
                                                         : torch::zeros({0, 5}, torch::kDouble);
  static const std::array<const char*, 4> kNames{"x", "y", "width", "height"};
  constexpr int kBins = 50;
  constexpr int kLeft = 150, kBottom = 150, kTop = 40, kRight = 40, kGap = 90;
  auto img = canvas(kCorrelogramPlotSize);
  const int cell = std::min((kCorrelogramPlotSize.width - kLeft - kRight - 3 * kGap) / 4,
                            (kCorrelogramPlotSize.height - kTop - kBottom - 3 * kGap) / 4);
  // Each variable's axis spans its data with 5 % margins, as matplotlib's autoscaling does; the values are
  // mapped to [0, 1] over that span for the histograms.
  std::array<double, 4> lo{}, hi{};
  std::array<torch::Tensor, 4> unit;
  for (int v = 0; v < 4; ++v) {
    const auto values = lb.select(1, 1 + v);
    double low = 0, high = 1;
    if (values.numel() > 0) {
      low = values.min().item<double>();
      high = values.max().item<double>();
      if (high - low < 1e-6) low -= 0.05, high += 0.05;
      const double margin = (high - low) * 0.05;
      low -= margin, high += margin;
    }
    lo[v] = low, hi[v] = high;
    unit[v] = (values - low) / (high - low);
  }
  AxesStyle st;
  st.font = 0.8;
  st.xticks = 4;
  st.yticks = 4;
  for (int row = 0; row < 4; ++row) {
    for (int col = 0; col <= row; ++col) {
      Axes ax;
      ax.box = cv::Rect(kLeft + col * (cell + kGap), kTop + row * (cell + kGap), cell, cell);
      ax.x0 = lo[col], ax.x1 = hi[col];
      st.xlabel = row == 3 ? kNames[col] : "";
      st.ylabel = col == 0 ? kNames[row] : "";
      if (col != row) {
        ax.y0 = lo[row], ax.y1 = hi[row];
        draw_density(img, ax, unit[col], unit[row], st);
        continue;
      }
      // The diagonal: how many boxes fall in each of 50 bins of the span.
      const auto counts =
          to_vec(torch::bincount((unit[col] * kBins).floor().clamp(0, kBins - 1).to(torch::kLong), {}, kBins));
      ax.y0 = 0;
      ax.y1 = std::max(1.0, *std::max_element(counts.begin(), counts.end()) * 1.05);
      AxesStyle diag = st;
      diag.min_ystep = 1;
      draw_axes(img, ax, diag);
      for (int b = 0; b < kBins; ++b) {
        if (counts[b] <= 0) continue;
        const double span = hi[col] - lo[col];
        const auto top = ax.px(lo[col] + span * b / kBins, counts[b]);
        const auto base = ax.px(lo[col] + span * (b + 1) / kBins, 0);
        cv::rectangle(img, cv::Point(cvRound(top.x) + 1, cvRound(top.y)),
                      cv::Point(cvRound(base.x) - 1, cvRound(base.y) - 1), bgr(kPalette[0]), -1);
      }
      cv::rectangle(img, ax.box, kAxis, 1, cv::LINE_AA);
    }
  }
  write_image(png_path, img);
}

torch::Tensor dataset_labels(const data::DatasetIndex& index) {
  std::vector<float> flat;
  for (const auto& rec : index.records) {
    for (const auto& b : rec.boxes) flat.insert(flat.end(), {b.cls, b.cx, b.cy, b.w, b.h});
  }
  const auto n = static_cast<int64_t>(flat.size() / 5);
  return torch::from_blob(flat.data(), {n, 5}, torch::kFloat32).clone();
}

PlotSize mosaic_size(int64_t b, int64_t h, int64_t w) {
  const int64_t bs = std::min<int64_t>(std::max<int64_t>(b, 1), kMosaicMaxImages);
  const auto ns = static_cast<int64_t>(std::ceil(std::sqrt(static_cast<double>(bs))));
  const double scale = std::min(1.0, kMosaicMaxSide / static_cast<double>(ns * std::max(h, w)));
  const auto th = static_cast<int64_t>(std::ceil(scale * h)), tw = static_cast<int64_t>(std::ceil(scale * w));
  return {static_cast<int>(ns * tw), static_cast<int>(ns * th)};
}

void plot_batch_mosaic(const std::string& png_path, const torch::Tensor& images, const torch::Tensor& labels,
                       const std::vector<std::string>& names, const std::vector<std::string>& paths) {
  if (!images.defined() || images.dim() != 4 || images.size(1) != 3 || images.size(0) < 1) {
    throw std::invalid_argument("plot_batch_mosaic('" + png_path + "'): images must be (B, 3, H, W)");
  }
  if (labels.defined() && labels.numel() > 0 && (labels.dim() != 2 || (labels.size(1) != 6 && labels.size(1) != 7))) {
    throw std::invalid_argument("plot_batch_mosaic('" + png_path +
                                "'): labels must be (N, 6) idx, cls, cx, cy, w, h or (N, 7) with conf");
  }
  const int64_t bs = std::min<int64_t>(images.size(0), kMosaicMaxImages);
  const int64_t h = images.size(2), w = images.size(3);
  const auto ns = static_cast<int>(std::ceil(std::sqrt(static_cast<double>(bs))));
  const double scale = std::min(1.0, kMosaicMaxSide / static_cast<double>(ns * std::max(h, w)));
  const int th = static_cast<int>(std::ceil(scale * h)), tw = static_cast<int>(std::ceil(scale * w));
  cv::Mat mosaic(ns * th, ns * tw, CV_8UC3, kWhite);

  auto imgs = images.detach().narrow(0, 0, bs).to(torch::kCPU);
  if (imgs.scalar_type() != torch::kUInt8) {
    // Float batches in 0..1 (the loader's normalised tensors) are accepted as well.
    const double mx = imgs.numel() ? imgs.max().item<double>() : 0.0;
    imgs = (mx <= 1.0 ? imgs * 255.0 : imgs).round().clamp(0, 255).to(torch::kUInt8);
  }
  imgs = imgs.permute({0, 2, 3, 1}).contiguous();  // (B, H, W, 3)

  const int lw = std::max(2, static_cast<int>(std::lround((mosaic.cols + mosaic.rows) / 2.0 * 0.003)));
  const double fs = std::clamp(std::min(th, tw) / 640.0 * 0.9, 0.35, 0.8);

  torch::Tensor lb = labels.defined() && labels.numel() > 0 ? labels.detach().to(torch::kCPU, torch::kDouble)
                                                            : torch::zeros({0, 6}, torch::kDouble);
  const bool has_conf = lb.size(1) == 7;
  const bool normalised = lb.size(0) == 0 || lb.narrow(1, 2, 4).abs().max().item<double>() <= 1.1;
  lb = lb.contiguous();
  const double* lp = lb.data_ptr<double>();
  const int64_t cols = lb.size(1);

  for (int64_t i = 0; i < bs; ++i) {
    const int ox = static_cast<int>(i % ns) * tw, oy = static_cast<int>(i / ns) * th;
    cv::Mat rgb(static_cast<int>(h), static_cast<int>(w), CV_8UC3, imgs[i].data_ptr<uint8_t>());
    cv::Mat tile;
    cv::cvtColor(rgb, tile, cv::COLOR_RGB2BGR);
    if (tile.cols != tw || tile.rows != th) cv::resize(tile, tile, cv::Size(tw, th), 0, 0, cv::INTER_AREA);
    const cv::Rect tile_rect(ox, oy, tw, th);
    tile.copyTo(mosaic(tile_rect));
    // Boxes and labels are drawn in tile coordinates, so they are clipped to their own tile.
    cv::Mat view = mosaic(tile_rect);
    for (int64_t r = 0; r < lb.size(0); ++r) {
      const double* row = lp + r * cols;
      if (static_cast<int64_t>(row[0]) != i) continue;
      if (has_conf && row[6] <= 0.25) continue;
      const auto cls = static_cast<int64_t>(row[1]);
      const double sx = normalised ? tw : scale, sy = normalised ? th : scale;
      const double cx = row[2] * sx, cy = row[3] * sy, bw = row[4] * sx, bh = row[5] * sy;
      const cv::Point p1(cvRound(cx - bw / 2), cvRound(cy - bh / 2));
      const cv::Point p2(cvRound(cx + bw / 2), cvRound(cy + bh / 2));
      const auto color = bgr(class_color(cls));
      // Axis-aligned boxes: no anti-aliasing needed, and the class colour stays exact.
      cv::rectangle(view, p1, p2, color, lw, cv::LINE_8);
      std::string label = shorten(class_name(names, cls), 20);
      if (has_conf) label += " " + fmt(row[6], 2);
      int baseline = 0;
      const auto ts = cv::getTextSize(label, kFont, fs, 1, &baseline);
      const int lh = ts.height + baseline + 4;
      const bool above = p1.y - lh >= 0;
      const cv::Rect lr(std::max(p1.x - lw / 2, 0), above ? p1.y - lh - lw / 2 : std::max(p1.y, 0) + lw / 2,
                        ts.width + 6, lh);
      view(lr & cv::Rect(0, 0, view.cols, view.rows)).setTo(color);
      const double lum = 0.114 * color[0] + 0.587 * color[1] + 0.299 * color[2];
      cv::putText(view, label, {lr.x + 3, lr.y + ts.height + 2}, kFont, fs, lum > 170 ? kBlack : kWhite, 1,
                  cv::LINE_AA);
    }
    if (i < static_cast<int64_t>(paths.size()) && !paths[i].empty()) {
      const auto fname = std::filesystem::path(paths[i]).filename().string();
      put_text(view, shorten(fname, 40), {5, th - 5}, fs * 0.8, cv::Scalar(220, 220, 220), 1, HAlign::kLeft,
               VAlign::kBottom);
    }
    cv::rectangle(mosaic, tile_rect, kWhite, 2);
  }
  write_image(png_path, mosaic);
}

torch::Tensor detections_to_mosaic_rows(const std::vector<torch::Tensor>& detections, const torch::Tensor& ratio_pad,
                                        int64_t height, int64_t width) {
  if (height < 1 || width < 1) throw std::invalid_argument("detections_to_mosaic_rows: height and width must be >= 1");
  const bool mapped = ratio_pad.defined() && ratio_pad.numel() > 0;
  if (mapped &&
      (ratio_pad.dim() != 2 || ratio_pad.size(1) != 4 || ratio_pad.size(0) < static_cast<int64_t>(detections.size()))) {
    throw std::invalid_argument("detections_to_mosaic_rows: ratio_pad must be (B, 4) with B >= the number of images");
  }
  const auto rp = mapped ? ratio_pad.detach().to(torch::kCPU, torch::kDouble) : torch::Tensor();
  std::vector<torch::Tensor> rows;
  for (size_t i = 0; i < detections.size(); ++i) {
    const auto& d = detections[i];
    if (!d.defined() || d.numel() == 0) continue;
    if (d.dim() != 2 || d.size(1) < 6) {
      throw std::invalid_argument("detections_to_mosaic_rows: image " + std::to_string(i) +
                                  " detections must be (n, 6)");
    }
    auto det = d.detach().to(torch::kCPU, torch::kDouble);
    auto xyxy = det.narrow(1, 0, 4);
    if (mapped) {
      const auto g = rp[static_cast<int64_t>(i)];
      // x * gain_w + pad_w, y * gain_h + pad_h
      const auto gain = torch::stack({g[1], g[0], g[1], g[0]});
      const auto pad = torch::stack({g[2], g[3], g[2], g[3]});
      xyxy = xyxy * gain + pad;
    }
    const auto scale = torch::tensor({1.0 / width, 1.0 / height, 1.0 / width, 1.0 / height}, torch::kDouble);
    const auto xywh = xyxy_to_xywh(xyxy) * scale;
    rows.push_back(torch::cat({torch::full({det.size(0), 1}, static_cast<double>(i), torch::kDouble),
                               det.narrow(1, 5, 1), xywh, det.narrow(1, 4, 1)},
                              1));
  }
  return rows.empty() ? torch::zeros({0, 7}, torch::kDouble) : torch::cat(rows, 0);
}

void plot_validation(const std::string& save_dir, const ApPerClass& stats, const torch::Tensor& confusion,
                     const std::vector<std::string>& names) {
  const std::filesystem::path dir(save_dir);
  plot_pr_curve((dir / "PR_curve.png").string(), stats, names);
  plot_f1_curve((dir / "F1_curve.png").string(), stats, names);
  plot_p_curve((dir / "P_curve.png").string(), stats, names);
  plot_r_curve((dir / "R_curve.png").string(), stats, names);
  if (confusion.defined() && confusion.numel() > 0) {
    plot_confusion_matrix((dir / "confusion_matrix.png").string(), confusion, names, false);
    plot_confusion_matrix((dir / "confusion_matrix_normalized.png").string(), confusion, names, true);
  }
}

}  // namespace yolo8
