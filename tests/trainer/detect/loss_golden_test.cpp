#include <gtest/gtest.h>

#include "tests/trainer/fixture_io.h"
#include "trainer/detect/loss.h"

namespace yolo8 {
namespace {

using test::as_double;
using test::as_list;
using test::as_tensors;
using test::at;

struct LossCase {
  std::vector<torch::Tensor> feats;
  LossTargets targets;
  torch::Tensor total;
  torch::Tensor items;
  std::vector<torch::Tensor> grads;
};

struct LossFixture {
  LossConfig config;
  std::vector<LossCase> cases;
};

LossFixture load_loss_fixture() {
  auto root = test::load_fixture("loss_cases.pt");
  LossFixture fx;
  fx.config.nc = at(root, "nc").toInt();
  fx.config.reg_max = at(root, "reg_max").toInt();
  auto strides = at(root, "strides").toTensor().to(torch::kDouble);
  fx.config.strides.assign(strides.data_ptr<double>(), strides.data_ptr<double>() + strides.numel());
  auto hyp = at(root, "hyp");
  fx.config.box = as_double(at(hyp, "box"));
  fx.config.cls = as_double(at(hyp, "cls"));
  fx.config.dfl = as_double(at(hyp, "dfl"));
  for (const auto& c : as_list(at(root, "cases"))) {
    LossCase lc;
    lc.feats = as_tensors(at(c, "feats"));
    auto hw = at(c, "imgsz_hw").toTensor();
    lc.targets = {at(c, "batch_idx").toTensor(),
                  at(c, "cls").toTensor(),
                  at(c, "bboxes").toTensor(),
                  {hw[0].item<int64_t>(), hw[1].item<int64_t>()}};
    lc.total = at(c, "loss_total").toTensor();
    lc.items = at(c, "loss_items").toTensor();
    lc.grads = as_tensors(at(c, "grads"));
    fx.cases.push_back(std::move(lc));
  }
  return fx;
}

struct Result {
  LossOutput out;
  std::vector<torch::Tensor> grads;
};

Result run(const DetectionLoss& loss, const LossCase& lc) {
  std::vector<torch::Tensor> feats;
  for (const auto& f : lc.feats) feats.push_back(f.clone().requires_grad_(true));
  auto out = loss(feats, lc.targets);
  out.total.backward();
  Result r{out, {}};
  for (const auto& f : feats) r.grads.push_back(f.grad());
  return r;
}

void expect_rel(double got, double want, double tol, const std::string& what) {
  EXPECT_LE(std::abs(got - want), tol * std::max(std::abs(want), 1e-12)) << what << ": got " << got << " want " << want;
}

TEST(LossGolden, FixtureMatchesConstants) {
  auto fx = load_loss_fixture();
  EXPECT_EQ(fx.config.nc, 4);
  EXPECT_EQ(fx.config.reg_max, 16);
  ASSERT_EQ(fx.cases.size(), 3u);
  EXPECT_EQ(fx.cases[1].targets.bboxes.size(0), 0);  // the empty-target case
}

TEST(LossGolden, ItemsTotalAndGradientsMatchReference) {
  auto fx = load_loss_fixture();
  DetectionLoss loss(fx.config);
  for (size_t ci = 0; ci < 2 * fx.cases.size(); ++ci) {
    // Each case twice: image size given explicitly, then derived from the maps.
    SCOPED_TRACE("case " + std::to_string(ci % fx.cases.size()) + (ci < fx.cases.size() ? "" : " (derived size)"));
    auto lc = fx.cases[ci % fx.cases.size()];
    if (ci >= fx.cases.size()) lc.targets.image_hw = {0, 0};
    auto r = run(loss, lc);
    expect_rel(r.out.total.item<double>(), lc.total.item<double>(), 1e-4, "total");
    ASSERT_EQ(r.out.items.numel(), 3);
    const char* names[3] = {"box", "cls", "dfl"};
    for (int64_t i = 0; i < 3; ++i) {
      const double want = lc.items[i].item<double>();
      if (want == 0.0) {
        EXPECT_EQ(r.out.items[i].item<double>(), 0.0) << names[i];
      } else {
        expect_rel(r.out.items[i].item<double>(), want, 1e-4, names[i]);
      }
    }
    ASSERT_EQ(r.grads.size(), lc.grads.size());
    for (size_t g = 0; g < lc.grads.size(); ++g) {
      ASSERT_TRUE(r.grads[g].defined());
      const double diff = (r.grads[g] - lc.grads[g]).abs().max().item<double>();
      EXPECT_LE(diff, 1e-4) << "grad of map " << g;
    }
  }
}

}  // namespace
}  // namespace yolo8
