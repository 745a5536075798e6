#include "data/config.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>

namespace yolo8::data {

CacheMode parse_cache_mode(const std::string& value) {
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v.empty() || v == "none" || v == "false" || v == "off") return CacheMode::kNone;
  if (v == "ram" || v == "true") return CacheMode::kRam;
  if (v == "disk") return CacheMode::kDisk;
  throw std::invalid_argument("cache: expected none, ram or disk, got '" + value + "'");
}

std::string to_string(CacheMode mode) {
  switch (mode) {
    case CacheMode::kRam: return "ram";
    case CacheMode::kDisk: return "disk";
    default: return "none";
  }
}

namespace {
void require(bool ok, const char* key, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string(key) + ": " + what);
}
void require_prob(double v, const char* key) {
  require(std::isfinite(v) && v >= 0.0 && v <= 1.0, key, "must be a probability in [0, 1], got " + std::to_string(v));
}
void require_nonneg(double v, const char* key) {
  require(std::isfinite(v) && v >= 0.0, key, "must be finite and >= 0, got " + std::to_string(v));
}
}  // namespace

void validate(const AugmentConfig& c) {
  require(std::isfinite(c.hsv_h) && c.hsv_h >= 0 && c.hsv_h <= 1, "hsv_h", "must be in [0, 1]");
  require(std::isfinite(c.hsv_s) && c.hsv_s >= 0 && c.hsv_s <= 1, "hsv_s", "must be in [0, 1]");
  require(std::isfinite(c.hsv_v) && c.hsv_v >= 0 && c.hsv_v <= 1, "hsv_v", "must be in [0, 1]");
  require_nonneg(c.degrees, "degrees");
  require(std::isfinite(c.translate) && c.translate >= 0 && c.translate <= 1, "translate", "must be in [0, 1]");
  require(std::isfinite(c.scale) && c.scale >= 0 && c.scale < 1, "scale", "must be in [0, 1)");
  require(std::isfinite(c.shear) && c.shear >= 0 && c.shear < 90, "shear", "must be in [0, 90)");
  require(std::isfinite(c.perspective) && c.perspective >= 0 && c.perspective <= 0.001, "perspective",
          "must be in [0, 0.001]");
  require_prob(c.flipud, "flipud");
  require_prob(c.fliplr, "fliplr");
  require_prob(c.mosaic, "mosaic");
  require_prob(c.mixup, "mixup");
  require(c.close_mosaic >= 0, "close_mosaic", "must be >= 0");
}

void validate(const LoaderConfig& c) {
  require(c.stride > 0, "stride", "must be > 0");
  require(c.imgsz >= 32 && c.imgsz <= 8192, "imgsz", "must be between 32 and 8192, got " + std::to_string(c.imgsz));
  require(c.imgsz >= c.stride && c.imgsz % c.stride == 0, "imgsz",
          "must be a positive multiple of " + std::to_string(c.stride) + ", got " + std::to_string(c.imgsz));
  require(c.batch >= 1, "batch", "must be >= 1, got " + std::to_string(c.batch));
  require(c.workers >= 0, "workers", "must be >= 0, got " + std::to_string(c.workers));
  require(std::isfinite(c.fraction) && c.fraction > 0 && c.fraction <= 1, "fraction", "must be in (0, 1]");
  require(c.prefetch >= 1, "prefetch", "must be >= 1");
}

}  // namespace yolo8::data
