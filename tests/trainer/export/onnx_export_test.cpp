// ONNX export: the file passes ONNX's own checker, has Ultralytics' layout and metadata, uses only operators that
// OpenCV DNN 4.6 loads as a static graph, and the exporter refuses what it cannot write.
#include "trainer/export/onnx_export.h"

#include <onnx/checker.h>
#include <onnx/onnx_pb.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "onnx_test_util.h"

namespace yolo8 {
namespace {

std::string out_path(const std::string& name) {
  const auto dir = std::filesystem::path(test::kBinaryDir) / "test-output" / "export";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

onnx::ModelProto read_model(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  onnx::ModelProto model;
  if (!model.ParseFromIstream(&in)) throw std::runtime_error("cannot parse " + path);
  return model;
}

std::vector<int64_t> dims_of(const onnx::ValueInfoProto& v) {
  std::vector<int64_t> dims;
  for (const auto& d : v.type().tensor_type().shape().dim()) dims.push_back(d.dim_value());
  return dims;
}

TEST(OnnxExport, FileHasUltralyticsLayoutAndPassesTheChecker) {
  LoadedModel loaded = test::fixture_model();
  OnnxExportOptions options;
  options.height = 128;
  options.width = 192;
  options.names = {"zero", "one", "two", "three"};
  const std::string path = out_path("layout.onnx");
  const OnnxExportSummary summary = export_onnx(loaded.model, options, path);
  EXPECT_NO_THROW(onnx::checker::check_model(path));

  const onnx::ModelProto model = read_model(path);
  ASSERT_EQ(model.opset_import_size(), 1);
  EXPECT_EQ(model.opset_import(0).version(), 12);
  ASSERT_EQ(model.graph().input_size(), 1);
  EXPECT_EQ(model.graph().input(0).name(), "images");
  EXPECT_EQ(dims_of(model.graph().input(0)), (std::vector<int64_t>{1, 3, 128, 192}));
  ASSERT_EQ(model.graph().output_size(), 1);
  EXPECT_EQ(model.graph().output(0).name(), "output0");
  // Strides 8, 16, 32 over 128×192: 16·24 + 8·12 + 4·6 anchors.
  const int64_t anchors = 16 * 24 + 8 * 12 + 4 * 6;
  EXPECT_EQ(summary.anchors, anchors);
  EXPECT_EQ(dims_of(model.graph().output(0)), (std::vector<int64_t>{1, 4 + 4, anchors}));

  std::map<std::string, std::string> meta;
  for (const auto& p : model.metadata_props()) meta[p.key()] = p.value();
  EXPECT_EQ(meta["names"], "{0: 'zero', 1: 'one', 2: 'two', 3: 'three'}");
  EXPECT_EQ(meta["stride"], "32");
  EXPECT_EQ(meta["imgsz"], "[128, 192]");
  EXPECT_EQ(meta["task"], "detect");
  EXPECT_EQ(meta["batch"], "1");
}

TEST(OnnxExport, GraphIsStaticWithConstantShapeInputs) {
  LoadedModel loaded = test::fixture_model();
  OnnxExportOptions options;
  options.height = options.width = 160;
  options.opset = 13;
  const std::string path = out_path("static13.onnx");
  export_onnx(loaded.model, options, path);
  EXPECT_NO_THROW(onnx::checker::check_model(path));
  const onnx::ModelProto model = read_model(path);
  EXPECT_EQ(model.opset_import(0).version(), 13);

  std::set<std::string> initializers;
  for (const auto& t : model.graph().initializer()) initializers.insert(t.name());
  const std::set<std::string> allowed{"Conv",    "Sigmoid", "Mul",     "Add",       "Split",   "Concat",
                                      "MaxPool", "Resize",  "Reshape", "Transpose", "Softmax", "MatMul"};
  std::set<std::string> ops;
  for (const auto& node : model.graph().node()) {
    ops.insert(node.op_type());
    EXPECT_TRUE(allowed.count(node.op_type())) << node.name() << " is a " << node.op_type();
    // Shape operands (Reshape targets, Split sizes, Resize roi/scales) are initializers, never computed.
    if (node.op_type() == "Reshape" || node.op_type() == "Split" || node.op_type() == "Resize") {
      for (int i = 1; i < node.input_size(); ++i) {
        EXPECT_TRUE(initializers.count(node.input(i))) << node.name() << " input " << i << " is computed";
      }
    }
  }
  EXPECT_TRUE(ops.count("Resize") && ops.count("Split") && ops.count("MaxPool") && ops.count("Softmax"));
  std::map<std::string, std::string> meta;
  for (const auto& p : model.metadata_props()) meta[p.key()] = p.value();
  EXPECT_EQ(meta["names"], "{0: 'class0', 1: 'class1', 2: 'class2', 3: 'class3'}");
}

TEST(OnnxExport, LeavesTheModelUnfused) {
  LoadedModel loaded = test::fixture_model();
  OnnxExportOptions options;
  options.height = options.width = 64;
  export_onnx(loaded.model, options, out_path("unfused.onnx"));
  EXPECT_FALSE(loaded.model->is_fused());
  EXPECT_TRUE(loaded.model->is_training());
}

TEST(OnnxExport, RefusesWhatAStaticFloatGraphCannotBe) {
  auto message = [](const OnnxExportOptions& options) {
    try {
      check_onnx_options(options, 32);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  OnnxExportOptions options;
  EXPECT_EQ(message(options), "accepted");
  options.opset = 11;
  EXPECT_NE(message(options).find("'opset'"), std::string::npos);
  options.opset = 17;
  EXPECT_NE(message(options).find("'opset'"), std::string::npos);
  options = {};
  options.dynamic = true;
  EXPECT_NE(message(options).find("'dynamic'"), std::string::npos);
  options = {};
  options.half = true;
  EXPECT_NE(message(options).find("'half'"), std::string::npos);
  options = {};
  options.width = 100;
  EXPECT_NE(message(options).find("'imgsz'"), std::string::npos);

  LoadedModel loaded = test::fixture_model();
  options = {};
  options.names = {"only", "three", "names"};
  EXPECT_THROW(export_onnx(loaded.model, options, out_path("bad_names.onnx")), std::invalid_argument);
}

TEST(OnnxExport, NamesAreWrittenAsPythonDictReprs) {
  EXPECT_EQ(python_names_dict({}), "{}");
  EXPECT_EQ(python_names_dict({"person", "traffic light"}), "{0: 'person', 1: 'traffic light'}");
  EXPECT_EQ(python_names_dict({"it's", "a\\b", "say \"hi\" it's"}),
            "{0: \"it's\", 1: 'a\\\\b', 2: 'say \"hi\" it\\'s'}");
}

}  // namespace
}  // namespace yolo8
