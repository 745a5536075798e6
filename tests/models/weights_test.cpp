// Export/import of state dicts, load_model entry points, clear errors for files that are not YOLOv8 detectors.
#include "models/weights.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "golden_util.h"

namespace yolo8 {
namespace {

std::string tmp_path(const std::string& name) { return std::string(test::kBinaryDir) + "/" + name; }

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(Weights, ExportRoundTrip) {
  auto loaded = load_model(test::fixture("yolov8n-shapes.pt"));
  const std::string out = tmp_path("exported_yolov8n_shapes.pt");
  const size_t n = export_state_dict(loaded.model, out);
  EXPECT_EQ(n, 355u);
  const auto back = read_state_dict_file(out);
  const auto own = state_dict(*loaded.model);
  ASSERT_EQ(back.size(), own.size());
  for (const auto& [name, t] : own) {
    auto it = back.find(name);
    ASSERT_NE(it, back.end()) << name;
    EXPECT_EQ(it->second.scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(torch::equal(it->second, t)) << name;
  }
  // The exported file is itself a model spec: architecture inferred (yolov8, scale n, nc 4).
  auto again = load_model(out);
  EXPECT_EQ(again.nc, 4);
  const auto fc = test::load_case("forward_case.pt");
  torch::NoGradGuard no_grad;
  again.model->eval();
  const auto pred = again.model->forward(test::dict_get(fc, "input").toTensor()).pred;
  EXPECT_LE(test::max_abs_diff(pred, test::dict_get(fc, "eval_output").toTensor()), 1e-4);
}

TEST(Weights, CopyModelIsDeepAndEqual) {
  auto loaded = load_model(test::fixture("yolov8n-shapes.pt"));
  auto copy = copy_model(loaded.model);
  const auto a = state_dict(*loaded.model), b = state_dict(*copy);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(torch::equal(a[i].second, b[i].second)) << a[i].first;
    EXPECT_NE(a[i].second.data_ptr(), b[i].second.data_ptr()) << a[i].first;
  }
  torch::NoGradGuard no_grad;
  b.front().second.add_(1.0);
  EXPECT_FALSE(torch::equal(a.front().second, b.front().second));
  EXPECT_TRUE(torch::equal(loaded.model->strides(), copy->strides()));
}

TEST(Weights, P2ExportReloads) {
  torch::manual_seed(1);
  auto model = build_model("yolov8n-p2.yaml", 2);
  const std::string out = tmp_path("exported_p2.pt");
  export_state_dict(model, out);
  auto back = load_model(out);
  EXPECT_EQ(back.nc, 2);
  EXPECT_EQ(back.model->detect()->nl(), 4);
  torch::NoGradGuard no_grad;
  model->eval();
  back.model->eval();
  const auto x = torch::rand({1, 3, 64, 64});
  EXPECT_TRUE(torch::equal(model->predict(x), back.model->predict(x)));
}

TEST(Weights, LoadModelFromYamlAndNames) {
  auto m = load_model("yolov8n.yaml", 3);
  EXPECT_EQ(m.nc, 3);
  EXPECT_EQ(m.names, (std::vector<std::string>{"class0", "class1", "class2"}));
  auto pt = load_model(test::fixture("yolov8n-shapes.pt"));
  EXPECT_EQ(pt.names, (std::vector<std::string>{"circle", "rectangle", "triangle", "scratch"}));
  auto sd = load_model(test::fixture("yolov8n-shapes.state_dict.pt"));
  EXPECT_EQ(sd.names, pt.names);
}

TEST(Weights, NcOverrideTransfersAllButClassConvs) {
  auto tuned = load_model(test::fixture("yolov8n-shapes.pt"), 6);
  EXPECT_EQ(tuned.nc, 6);
  EXPECT_EQ(tuned.model->nc(), 6);
  const auto ck = read_ultralytics_checkpoint(test::fixture("yolov8n-shapes.pt"));
  size_t same = 0, total = 0;
  for (const auto& [name, t] : state_dict(*tuned.model)) {
    ++total;
    auto it = ck.weights.find(name);
    if (it != ck.weights.end() && it->second.sizes() == t.sizes() && torch::equal(it->second, t)) ++same;
  }
  EXPECT_EQ(total - same, 6u);  // cv3.{0,1,2}.2.{weight,bias} start fresh
}

TEST(Weights, WrongFilesGiveOneLineErrors) {
  std::vector<std::pair<std::string, std::string>> cases;
  cases.emplace_back(tmp_path("missing_file.pt"), "");
  const std::string text = tmp_path("text_file.pt");
  write_bytes(text, "this is not a checkpoint\n");
  cases.emplace_back(text, "");
  const std::string empty = tmp_path("empty_file.pt");
  write_bytes(empty, "");
  cases.emplace_back(empty, "");
  const std::string bytes = test::read_bytes(test::fixture("yolov8n-shapes.pt"));
  const std::string truncated = tmp_path("truncated.pt");
  write_bytes(truncated, bytes.substr(0, bytes.size() / 2));
  cases.emplace_back(truncated, "");
  cases.emplace_back(test::fixture("forward_case.pt"), "not a YOLOv8 detection state dict");
  for (const auto& [path, expect] : cases) {
    const std::string msg = error_of([&] { load_model(path); });
    EXPECT_FALSE(msg.empty()) << path;
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    if (!expect.empty()) {
      EXPECT_NE(msg.find(expect), std::string::npos) << msg;
    }
    std::cout << "error: " << msg << "\n";
  }
}

// Same-length renames inside the stored pickle turn the checkpoint into another task's model.
std::string patched(std::string bytes, const std::string& from, const std::string& to) {
  const size_t pos = bytes.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  bytes.replace(pos, from.size(), to);
  return bytes;
}

TEST(Weights, EmaEntryPreferredWhenPresent) {
  // Point 'ema' at the pickled model object (BINGET 5) in place of None; MARK/POP_MARK pairs keep the length.
  const std::string bytes = test::read_bytes(test::fixture("yolov8n-shapes.pt"));
  const std::string from = std::string("emar\x10\x1b\x00\x00N", 9);
  const std::string to = std::string("ema(1(1h\x05", 9);
  const auto ck = read_ultralytics_checkpoint_bytes(patched(bytes, from, to), "ema.pt");
  EXPECT_TRUE(ck.from_ema);
  EXPECT_EQ(ck.weights.size(), 355u);
  EXPECT_FALSE(read_ultralytics_checkpoint_bytes(bytes, "plain.pt").from_ema);
}

TEST(Weights, NonDetectionCheckpointsRejected) {
  const std::string bytes = test::read_bytes(test::fixture("yolov8n-shapes.pt"));
  const std::string seg_model = tmp_path("seg_model.pt");
  write_bytes(seg_model, patched(bytes, "tasks\nDetectionModel\n", "tasks\nSegmentXXModel\n"));
  std::string msg = error_of([&] { load_model(seg_model); });
  EXPECT_NE(msg.find(seg_model), std::string::npos) << msg;
  EXPECT_NE(msg.find("not a YOLOv8 detection model"), std::string::npos) << msg;

  const std::string seg_head = tmp_path("seg_head.pt");
  write_bytes(seg_head, patched(bytes, "head\nDetect\n", "head\nSegmnt\n"));
  msg = error_of([&] { load_model(seg_head); });
  std::cout << "error: " << msg << "\n";
  EXPECT_NE(msg.find("head is Segmnt"), std::string::npos) << msg;
}

}  // namespace
}  // namespace yolo8
