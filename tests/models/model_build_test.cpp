// Structure of the built networks: parameter counts, state-dict names, strides, YAML handling.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>

#include "models/model_info.h"
#include "models/yolo.h"
#include "test_paths.h"

namespace yolo8 {
namespace {

int64_t count_params(const torch::nn::Module& m) {
  int64_t n = 0;
  for (const auto& p : m.parameters()) n += p.numel();
  return n;
}

std::string models_dir() { return std::string(test::kSourceDir) + "/configs/models"; }

struct CountCase {
  const char* name;
  int64_t params;
  double gflops;   // Ultralytics' figure at 640 (fused model)
  int64_t layers;  // Ultralytics' module count before fusion
};
void PrintTo(const CountCase& c, std::ostream* os) { *os << c.name; }

class ParamCount : public ::testing::TestWithParam<CountCase> {};

TEST_P(ParamCount, MatchesUltralytics) {
  const auto c = GetParam();
  auto model = build_model(models_dir() + "/" + c.name, 80);
  EXPECT_EQ(count_params(*model), c.params) << c.name;
  EXPECT_EQ(model->nc(), 80);
  EXPECT_EQ(model->layers().size(), 23u);
  auto info = model_info(model, 640);
  std::cout << c.name << ": " << info.layers << " layers, " << info.parameters << " parameters, " << info.gradients
            << " gradients, " << info.gflops << " GFLOPs\n";
  EXPECT_EQ(info.parameters, c.params);
  EXPECT_EQ(info.layers, c.layers);
  EXPECT_EQ(info.gradients, c.params - kRegMax);  // only the fixed DFL conv is frozen
  EXPECT_NEAR(info.gflops, c.gflops, 0.1);
  int64_t row_sum = 0;
  for (const auto& r : info.rows) row_sum += r.params;
  EXPECT_EQ(row_sum, c.params);
}

INSTANTIATE_TEST_SUITE_P(AllScales, ParamCount,
                         ::testing::Values(CountCase{"yolov8n.yaml", 3157200, 8.7, 225},
                                           CountCase{"yolov8s.yaml", 11166560, 28.6, 225},
                                           CountCase{"yolov8m.yaml", 25902640, 78.9, 295},
                                           CountCase{"yolov8l.yaml", 43691520, 165.2, 365},
                                           CountCase{"yolov8x.yaml", 68229648, 257.8, 365}),
                         [](const auto& param_info) { return std::string(param_info.param.name).substr(0, 7); });

}  // namespace
}  // namespace yolo8
