#pragma once
// Random generator states as checkpointable values: LibTorch's default generators and std engines as text.

#include <torch/torch.h>

#include <map>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace yolo8 {

struct RngState {
  torch::Tensor torch_cpu;                     // uint8 state of the default CPU generator
  std::vector<torch::Tensor> torch_cuda;       // one per visible CUDA device (empty without CUDA)
  std::map<std::string, std::string> streams;  // named std engines (see engine_state)
};

// Captures the LibTorch default generators (CPU, and every CUDA device when available).
RngState capture_torch_rng();
// Restores what capture_torch_rng stored; throws std::invalid_argument on a malformed state.
void restore_torch_rng(const RngState& state);

// Text form of a standard engine (std::mt19937, std::mt19937_64, ...), as operator<< writes it.
template <typename Engine>
std::string engine_state(const Engine& engine) {
  std::ostringstream out;
  out << engine;
  return out.str();
}

template <typename Engine>
void set_engine_state(Engine& engine, const std::string& text) {
  std::istringstream in(text);
  Engine restored;
  in >> restored;
  if (in.fail())
    throw std::invalid_argument("random engine state: malformed text (" + std::to_string(text.size()) + " chars)");
  engine = restored;
}

}  // namespace yolo8
