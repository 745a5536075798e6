#include "trainer/core/train_settings.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <stdexcept>

namespace yolo8 {
namespace {

void require(bool ok, const char* key, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string(key) + ": " + what);
}

}  // namespace

std::string canonical_optimizer_name(const std::string& name) {
  std::string l = name;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (l == "sgd") return "SGD";
  if (l == "adam") return "Adam";
  if (l == "adamw") return "AdamW";
  if (l == "auto") return "auto";
  throw std::invalid_argument("optimizer: unknown value '" + name + "' (expected SGD, Adam, AdamW or auto)");
}

void validate(const OptimSettings& s) {
  canonical_optimizer_name(s.optimizer);
  require(std::isfinite(s.lr0) && s.lr0 > 0.0, "lr0", "must be > 0");
  require(std::isfinite(s.lrf) && s.lrf > 0.0 && s.lrf <= 1.0, "lrf", "must be in (0, 1]");
  require(std::isfinite(s.momentum) && s.momentum >= 0.0 && s.momentum < 1.0, "momentum", "must be in [0, 1)");
  require(std::isfinite(s.weight_decay) && s.weight_decay >= 0.0, "weight_decay", "must be >= 0");
  require(std::isfinite(s.warmup_epochs) && s.warmup_epochs >= 0.0, "warmup_epochs", "must be >= 0");
  require(std::isfinite(s.warmup_momentum) && s.warmup_momentum >= 0.0 && s.warmup_momentum < 1.0, "warmup_momentum",
          "must be in [0, 1)");
  require(std::isfinite(s.warmup_bias_lr) && s.warmup_bias_lr >= 0.0, "warmup_bias_lr", "must be >= 0");
  require(s.nbs >= 1, "nbs", "must be >= 1");
}

void validate(const LossGains& g) {
  require(std::isfinite(g.box) && g.box >= 0.0, "box", "gain must be >= 0");
  require(std::isfinite(g.cls) && g.cls >= 0.0, "cls", "gain must be >= 0");
  require(std::isfinite(g.dfl) && g.dfl >= 0.0, "dfl", "gain must be >= 0");
}

}  // namespace yolo8
