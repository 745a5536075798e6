#pragma once
// Predictions as COCO results JSON ([{image_id, category_id, bbox: [x, y, w, h], score}]) for external evaluators.
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <string>
#include <vector>

namespace yolo8 {

// COCO category id of each of the 80 contiguous training classes (COCO ids skip 12, 26, 29, 30, 45, ...).
const std::vector<int64_t>& coco80_to_coco91();

// Image id from an image path: the file stem as a number when it is all digits, else the stem as a string.
nlohmann::json coco_image_id(const std::string& image_path);

class CocoJsonWriter {
 public:
  // category_ids[c] is the category id written for class c; empty means the class index itself.
  explicit CocoJsonWriter(std::vector<int64_t> category_ids = {});

  // detections (N, 6): x1, y1, x2, y2, conf, cls in the original image's pixels.
  void add(const nlohmann::json& image_id, const torch::Tensor& detections);
  const nlohmann::json& results() const { return results_; }
  size_t size() const { return results_.size(); }
  // Throws std::runtime_error naming the path when it cannot be written.
  void write(const std::string& path) const;

 private:
  std::vector<int64_t> category_ids_;
  nlohmann::json results_ = nlohmann::json::array();
};

}  // namespace yolo8
