#include "trainer/detect/coco_json.h"

#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace yolo8 {

namespace {
double round_to(double v, double scale) { return std::nearbyint(v * scale) / scale; }
}  // namespace

const std::vector<int64_t>& coco80_to_coco91() {
  static const std::vector<int64_t> kMap = [] {
    const std::vector<int64_t> kMissing = {12, 26, 29, 30, 45, 66, 68, 69, 71, 83};
    std::vector<int64_t> ids;
    for (int64_t id = 1; id <= 90; ++id) {
      bool missing = false;
      for (auto m : kMissing) missing = missing || m == id;
      if (!missing) ids.push_back(id);
    }
    return ids;
  }();
  return kMap;
}

nlohmann::json coco_image_id(const std::string& image_path) {
  const std::string stem = std::filesystem::path(image_path).stem().string();
  bool numeric = !stem.empty() && stem.size() <= 18;
  for (char ch : stem) numeric = numeric && std::isdigit(static_cast<unsigned char>(ch));
  if (numeric) return std::stoll(stem);
  return stem;
}

CocoJsonWriter::CocoJsonWriter(std::vector<int64_t> category_ids) : category_ids_(std::move(category_ids)) {}

void CocoJsonWriter::add(const nlohmann::json& image_id, const torch::Tensor& detections) {
  if (detections.numel() == 0) return;
  if (detections.dim() != 2 || detections.size(1) < 6) {
    throw std::invalid_argument("CocoJsonWriter::add: detections must be (N, 6)");
  }
  auto d = detections.detach().to(torch::kCPU).to(torch::kDouble).contiguous();
  auto a = d.accessor<double, 2>();
  for (int64_t i = 0; i < d.size(0); ++i) {
    const auto cls = static_cast<int64_t>(a[i][5]);
    int64_t category = cls;
    if (!category_ids_.empty()) {
      if (cls < 0 || cls >= static_cast<int64_t>(category_ids_.size())) {
        throw std::invalid_argument("CocoJsonWriter::add: class " + std::to_string(cls) + " has no category id");
      }
      category = category_ids_[static_cast<size_t>(cls)];
    }
    const double x1 = a[i][0], y1 = a[i][1], x2 = a[i][2], y2 = a[i][3];
    results_.push_back(
        {{"image_id", image_id},
         {"category_id", category},
         {"bbox", {round_to(x1, 1e3), round_to(y1, 1e3), round_to(x2 - x1, 1e3), round_to(y2 - y1, 1e3)}},
         {"score", round_to(a[i][4], 1e5)}});
  }
}

void CocoJsonWriter::write(const std::string& path) const {
  const auto parent = std::filesystem::path(path).parent_path();
  std::error_code ec;
  if (!parent.empty()) std::filesystem::create_directories(parent, ec);
  std::ofstream out(path);
  if (!out) throw std::runtime_error("cannot write COCO predictions to " + path);
  out << results_.dump();
  if (!out) throw std::runtime_error("failed writing COCO predictions to " + path);
}

}  // namespace yolo8
