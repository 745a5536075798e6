// `yolo8 predict`: images or a folder through weights (or an ONNX file, predict_onnx.h), read ahead, drawn and saved
// in file order. Built only with OpenCV.

#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "common/exit_codes.h"
#include "trainer/core/autocast.h"
#include "trainer/core/checkpoint.h"
#include "trainer/core/train_step.h"
#include "trainer/detect/nms.h"
#include "trainer/modes/mode_args.h"
#include "trainer/modes/modes.h"
#include "trainer/modes/predict_onnx.h"
#include "trainer/runtime/run_dir.h"
#include "trainer/runtime/threads.h"
#include "trainer/support/mode_support.h"

namespace yolo8 {
namespace fs = std::filesystem;
using app::Clock;
using app::seconds_since;

namespace {

cv::Scalar class_colour(int64_t cls) {
  static const int kPalette[][3] = {{56, 56, 255},  {151, 157, 255}, {31, 112, 255}, {29, 178, 255},
                                    {49, 210, 207}, {10, 249, 72},   {23, 204, 146}, {134, 219, 61},
                                    {52, 147, 26},  {187, 212, 0},   {168, 153, 44}, {255, 194, 0}};
  const auto& c = kPalette[cls % 12];
  return cv::Scalar(c[0], c[1], c[2]);
}

std::vector<std::string> list_images(const std::string& source) {
  std::vector<std::string> files;
  if (fs::is_directory(source)) {
    for (const auto& entry : fs::recursive_directory_iterator(source)) {
      if (entry.is_regular_file() && data::is_image_extension(entry.path().string())) {
        files.push_back(entry.path().string());
      }
    }
    std::sort(files.begin(), files.end());
  } else if (fs::is_regular_file(source)) {
    files.push_back(source);
  } else {
    throw DataError("source '" + source + "' is neither an image nor a folder");
  }
  return files;
}

// The weights' forward pass, on `device`, under autocast with half=true on CUDA.
PredictModel open_weights_predict_model(const Settings& settings, const torch::Device& device) {
  LoadedModel loaded = load_any_model(settings.model);
  DetectionModel model = loaded.model;
  prepare_for_inference(model, device);
  PredictModel predict;
  predict.names = loaded.names;
  predict.stride = static_cast<int>(model->max_stride());
  predict.description = loaded.source + " on " + device.str();
  const bool half = settings.half && device.is_cuda();
  predict.forward = [model, device, half](const torch::Tensor& input) mutable {
    torch::NoGradGuard no_grad;
    AutocastGuard autocast(device.type(), half);
    return model->predict(input.to(device)).to(torch::kCPU, torch::kFloat);
  };
  return predict;
}

// Where predict spent its time (seconds, all images); `reading` ran on the read-ahead threads, `waiting` is the
// part of it the model's thread waited for.
struct PredictTimes {
  int64_t images = 0;
  double reading = 0, waiting = 0, preprocess = 0, inference = 0, postprocess = 0, saving = 0;
  std::string per_image() const {
    const double per = 1000.0 / static_cast<double>(std::max<int64_t>(1, images));
    std::ostringstream out;
    out << std::fixed << std::setprecision(1) << reading * per << " ms reading and letterboxing (" << waiting * per
        << " ms not hidden), " << preprocess * per << " ms preprocess, " << inference * per << " ms inference, "
        << postprocess * per << " ms postprocess, " << saving * per << " ms drawing and saving per image";
    return out.str();
  }
};

// One image read and letterboxed for `model` (BGR as read, and the model's RGB input); `image` is empty when the
// file could not be read. Thread-safe: run_predict prepares the next images while the model runs.
struct PreparedImage {
  cv::Mat image;
  cv::Mat rgb;  // out_h × out_w × 3 uint8
  data::LetterboxInfo info;
  int out_h = 0, out_w = 0;
  double seconds = 0;  // reading and letterboxing, on the thread that did it
};

PreparedImage prepare_image(const std::string& file, const PredictModel& model, int target_h, int target_w) {
  const int stride = model.stride;
  const auto start = Clock::now();
  PreparedImage prepared;
  prepared.image = cv::imread(file, cv::IMREAD_COLOR);
  const cv::Mat& image = prepared.image;
  if (image.empty()) return prepared;
  // Minimal padding to the stride, as the reference's predictor does for weights; imgsz=h,w bounds height and
  // width apart. A static ONNX graph takes one size: the image is letterboxed to it (the reference does the same).
  const double gain = std::min(static_cast<double>(target_h) / image.rows, static_cast<double>(target_w) / image.cols);
  // Half to even, as Python's round() in the reference's LetterBox: 257 rows at gain 0.5 give 128, not 129 (which
  // padded to 160 rows; Peer.UltralyticsOpensOurCheckpoints found it).
  const int new_h = static_cast<int>(std::nearbyint(image.rows * gain));
  const int new_w = static_cast<int>(std::nearbyint(image.cols * gain));
  const int out_h = prepared.out_h =
      model.fixed_height > 0 ? model.fixed_height : (new_h + stride - 1) / stride * stride;
  const int out_w = prepared.out_w = model.fixed_width > 0 ? model.fixed_width : (new_w + stride - 1) / stride * stride;
  data::LetterboxInfo& info = prepared.info;
  cv::Mat boxed;
  if (model.fixed_height > 0 || out_h > target_h || out_w > target_w) {  // a graph's size; imgsz off the stride
    boxed = data::letterbox(image, out_h, out_w, true, &info);
  } else {
    // The reference resizes at imgsz's gain and pads only to the stride. Letterboxing to out_h x out_w would take
    // that size's gain (257x320 into 128x160: 0.498, 159 columns, not 160): letterbox into imgsz, then cut the
    // padding down to out_h x out_w, split as the reference splits it (one more row or column at the bottom/right).
    const cv::Mat full = data::letterbox(image, target_h, target_w, true, &info);
    const int top = static_cast<int>(std::nearbyint((out_h - info.new_h) / 2.0 - 0.1));
    const int left = static_cast<int>(std::nearbyint((out_w - info.new_w) / 2.0 - 0.1));
    boxed = full(cv::Rect(info.left - left, info.top - top, out_w, out_h));  // cvtColor copies it
    // Boxes go back as the reference's scale_boxes maps them: with the padded size's gain and the padding that
    // gain implies, not the resize gain (0.498 and 0 columns above, not 0.5).
    info.ratio = std::min(static_cast<double>(out_h) / image.rows, static_cast<double>(out_w) / image.cols);
    info.left = static_cast<int>(std::nearbyint((out_w - image.cols * info.ratio) / 2.0 - 0.1));
    info.top = static_cast<int>(std::nearbyint((out_h - image.rows * info.ratio) / 2.0 - 0.1));
  }
  cv::cvtColor(boxed, prepared.rgb, cv::COLOR_BGR2RGB);
  prepared.seconds = seconds_since(start);
  return prepared;
}

int run_predict(const Settings& settings) {
  configure_threads(settings);
  if (settings.source.empty()) throw SettingsError("setting 'source' is required for predict (an image or a folder)");
  const PredictModel model = is_onnx_path(settings.model)
                                 ? open_onnx_predict_model(settings.model)
                                 : open_weights_predict_model(settings, app::pick_device(settings));
  std::cout << "Predicting with " << model.description << "\n";
  const fs::path run_dir =
      make_run_dir(project_dir(settings.project, settings.task), "predict", settings.name, settings.exist_ok);
  if (settings.save_txt) fs::create_directories(run_dir / "labels");
  NmsConfig nms;
  nms.conf_thres = settings.conf >= 0 ? settings.conf : 0.25;
  nms.iou_thres = settings.iou;
  nms.max_det = settings.max_det;
  nms.agnostic = settings.agnostic_nms;
  const int target_h = settings.imgsz_hw.empty() ? settings.loader.imgsz : settings.imgsz_hw[0];
  const int target_w = settings.imgsz_hw.empty() ? settings.loader.imgsz : settings.imgsz_hw[1];
  const std::vector<std::string> files = list_images(settings.source);
  int64_t total_detections = 0;
  // Images are read and letterboxed up to kReadAhead ahead, each on a thread of its own, while this thread runs
  // the model on the current one; they are taken in file order, so the output is that of one after another.
  constexpr size_t kReadAhead = 2;
  std::deque<std::future<PreparedImage>> ahead;
  size_t next_file = 0;
  const auto read_ahead = [&] {
    for (; ahead.size() < kReadAhead && next_file < files.size(); ++next_file) {
      ahead.push_back(std::async(std::launch::async, prepare_image, std::cref(files[next_file]), std::cref(model),
                                 target_h, target_w));
    }
  };
  PredictTimes times;
  const auto lap = [](Clock::time_point& since, double& stage) {
    const auto now = Clock::now();
    stage += std::chrono::duration<double>(now - since).count();
    since = now;
  };
  const auto next_image = [&] {
    read_ahead();
    auto since = Clock::now();
    PreparedImage prepared = ahead.front().get();
    ahead.pop_front();
    lap(since, times.waiting);
    read_ahead();
    times.reading += prepared.seconds;
    return prepared;
  };
  for (const std::string& file : files) {
    PreparedImage prepared = next_image();
    const cv::Mat& image = prepared.image;
    if (image.empty()) {
      std::cerr << "predict: skipping unreadable image " << file << "\n";
      continue;
    }
    const data::LetterboxInfo& info = prepared.info;
    const int out_h = prepared.out_h, out_w = prepared.out_w;
    auto stage = Clock::now();
    const cv::Mat& rgb = prepared.rgb;
    const torch::Tensor input = app::model_input(
        torch::from_blob(rgb.data, {1, rgb.rows, rgb.cols, 3}, torch::kUInt8).permute({0, 3, 1, 2}), torch::kCPU,
        /*channels_last=*/false);
    lap(stage, times.preprocess);
    const torch::Tensor prediction = model.forward(input);
    lap(stage, times.inference);
    torch::Tensor detections = non_max_suppression(prediction, nms)[0];
    if (!settings.classes.empty() && detections.size(0) > 0) {
      torch::Tensor keep = torch::zeros({detections.size(0)}, torch::kBool);
      for (int cls : settings.classes) keep |= detections.select(1, 5) == cls;
      detections = detections.index({keep});
    }
    const ImageGeometry geometry{
        image.rows, image.cols, info.ratio, info.ratio, static_cast<double>(info.left), static_cast<double>(info.top)};
    detections = boxes_to_original(detections, geometry);
    lap(stage, times.postprocess);
    ++times.images;
    total_detections += detections.size(0);
    cv::Mat drawn = image.clone();
    const int thickness = settings.line_width > 0
                              ? settings.line_width
                              : std::max(1, static_cast<int>(std::lround((image.rows + image.cols) * 0.002)));
    std::ofstream txt;
    if (settings.save_txt) txt.open(run_dir / "labels" / (fs::path(file).stem().string() + ".txt"));
    const auto rows = detections.accessor<float, 2>();
    for (int64_t k = 0; k < detections.size(0); ++k) {
      const int64_t cls = static_cast<int64_t>(rows[k][5]);
      const cv::Point top_left(static_cast<int>(rows[k][0]), static_cast<int>(rows[k][1]));
      const cv::Point bottom_right(static_cast<int>(rows[k][2]), static_cast<int>(rows[k][3]));
      cv::rectangle(drawn, top_left, bottom_right, class_colour(cls), thickness, cv::LINE_AA);
      if (settings.show_labels) {
        std::ostringstream label;
        label << (cls < static_cast<int64_t>(model.names.size()) ? model.names[cls] : std::to_string(cls));
        if (settings.show_conf) label << " " << std::fixed << std::setprecision(2) << rows[k][4];
        int baseline = 0;
        const double font = std::max(0.4, thickness / 3.0);
        const cv::Size size = cv::getTextSize(label.str(), cv::FONT_HERSHEY_SIMPLEX, font, 1, &baseline);
        const cv::Point origin(top_left.x, std::max(size.height + 2, top_left.y));
        cv::rectangle(drawn, origin - cv::Point(0, size.height + 2), origin + cv::Point(size.width, baseline),
                      class_colour(cls), cv::FILLED);
        cv::putText(drawn, label.str(), origin, cv::FONT_HERSHEY_SIMPLEX, font, cv::Scalar(255, 255, 255), 1,
                    cv::LINE_AA);
      }
      if (txt) {
        const double cx = (rows[k][0] + rows[k][2]) / 2.0 / image.cols,
                     cy = (rows[k][1] + rows[k][3]) / 2.0 / image.rows;
        const double w = (rows[k][2] - rows[k][0]) / image.cols, h = (rows[k][3] - rows[k][1]) / image.rows;
        txt << cls << " " << std::setprecision(6) << cx << " " << cy << " " << w << " " << h;
        if (settings.save_conf) txt << " " << rows[k][4];
        txt << "\n";
      }
    }
    if (settings.save) cv::imwrite((run_dir / fs::path(file).filename()).string(), drawn);
    std::cout << file << ": " << out_h << "x" << out_w << " " << detections.size(0) << " detections\n";
    lap(stage, times.saving);
  }
  std::cout << "Speed: " << times.per_image() << "\n";
  std::cout << files.size() << " images, " << total_detections << " detections. Results saved to " << run_dir.string()
            << "\n";
  return kExitCompleted;
}

}  // namespace

int predict_mode(const CommandLine& command) { return run_predict(settings_for_mode(command.pairs, "predict")); }

}  // namespace yolo8
