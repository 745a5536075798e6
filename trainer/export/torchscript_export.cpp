#include "trainer/export/torchscript_export.h"

#include <torch/csrc/jit/frontend/tracer.h>
#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/script.h>

#include <stdexcept>

#include "models/weights.h"

namespace yolo8 {

void export_torchscript(const DetectionModel& source_model, int64_t height, int64_t width, const std::string& path) {
  const int64_t stride = source_model->max_stride();
  if (height <= 0 || width <= 0 || height % stride != 0 || width % stride != 0) {
    throw std::invalid_argument("setting 'imgsz' must be a multiple of the model's stride " + std::to_string(stride) +
                                ", got " + std::to_string(height) + "," + std::to_string(width));
  }
  DetectionModel model = copy_model(source_model);
  model->to(torch::kCPU, torch::kFloat);
  model->eval();
  model->fuse();
  // The tracer stores every tensor it did not see as an input as a constant, which it allows only without grad.
  for (auto& p : model->parameters()) p.set_requires_grad(false);

  const torch::Tensor example = torch::zeros({1, model->config().ch, height, width});
  auto traced = torch::jit::tracer::trace(
      {example}, [&](torch::jit::Stack inputs) { return torch::jit::Stack{model->predict(inputs.at(0).toTensor())}; },
      [](const torch::autograd::Variable&) { return std::string(); }, /*strict=*/false);
  std::shared_ptr<torch::jit::Graph> graph = traced.first->graph;
  torch::jit::EliminateDeadCode(graph);

  // A module with one method, forward(self, images), whose body is the traced graph.
  torch::jit::Module module("__torch__.yolo8.DetectionModel");
  graph->insertInput(0, "self")->setType(module._ivalue()->type());
  auto* fn = module._ivalue()->compilation_unit()->create_function(
      c10::QualifiedName(*module.type()->name(), "forward"), graph);
  module.type()->addMethod(fn);
  module.save(path);
}

}  // namespace yolo8
