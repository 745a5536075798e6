#pragma once
// The recipe's settings the command line fills: optimizer and schedule, loss gains. Plain structs without
// LibTorch, so yolo8's settings table can hold them and point into them; their defaults live only here.

#include <cstdint>
#include <string>

namespace yolo8 {

// Recipe settings with Ultralytics names and defaults.
struct OptimSettings {
  std::string optimizer = "auto";  // SGD | Adam | AdamW | auto
  double lr0 = 0.01;
  double lrf = 0.01;
  double momentum = 0.937;
  double weight_decay = 0.0005;
  double warmup_epochs = 3.0;
  double warmup_momentum = 0.8;
  double warmup_bias_lr = 0.1;
  int64_t nbs = 64;
  bool cos_lr = false;
};

// Gains of the three loss terms.
struct LossGains {
  double box = 7.5;
  double cls = 0.5;
  double dfl = 1.5;
};

// Throw std::invalid_argument "KEY: what is wrong", KEY being the setting's name.
void validate(const OptimSettings& settings);
void validate(const LossGains& gains);

// Canonical optimizer name ("SGD", "Adam", "AdamW", "auto") for a case-insensitive spelling; throws otherwise.
std::string canonical_optimizer_name(const std::string& name);

}  // namespace yolo8
