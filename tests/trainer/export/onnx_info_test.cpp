// Reading an exported detector back: the input size from the graph, names and stride from the metadata, in the
// Python dict spelling Ultralytics writes.
#include "trainer/export/onnx_info.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "onnx_test_util.h"
#include "trainer/export/onnx_export.h"

namespace yolo8 {
namespace {

TEST(OnnxInfo, NamesRoundTripThroughPythonsSpelling) {
  const std::vector<std::string> names{"person", "it's", "say \"hi\"", "back\\slash", "two\nlines", ""};
  EXPECT_EQ(parse_python_names_dict(python_names_dict(names)), names);
  EXPECT_EQ(parse_python_names_dict("{0: 'person', 1: 'bicycle'}"), (std::vector<std::string>{"person", "bicycle"}));
  EXPECT_EQ(parse_python_names_dict("{}"), std::vector<std::string>{});
}

TEST(OnnxInfo, MalformedNamesSayWhere) {
  EXPECT_THROW(parse_python_names_dict("{0: 'a', 2: 'c'}"), std::invalid_argument);  // ids must run 0..n-1
  EXPECT_THROW(parse_python_names_dict("{0: 'a', 0: 'b'}"), std::invalid_argument);
  EXPECT_THROW(parse_python_names_dict("{0: 'a'"), std::invalid_argument);
  EXPECT_THROW(parse_python_names_dict("[0, 1]"), std::invalid_argument);
  try {
    parse_python_names_dict("{0: person}");
    FAIL() << "an unquoted name parsed";
  } catch (const std::invalid_argument& error) {
    EXPECT_STREQ(error.what(), "names: expected a quoted name at character 5");
  }
}

TEST(OnnxInfo, ReadsWhatTheExporterWrote) {
  LoadedModel loaded = test::fixture_model();
  OnnxExportOptions options;
  options.height = 128;
  options.width = 192;
  options.names.clear();
  for (int64_t i = 0; i < loaded.nc; ++i) options.names.push_back("part '" + std::to_string(i) + "'");
  const auto dir = std::filesystem::path(test::kBinaryDir) / "test-output" / "export";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "info.onnx").string();
  export_onnx(loaded.model, options, path);
  const OnnxModelInfo info = read_onnx_info(path);
  EXPECT_EQ(info.height, 128);
  EXPECT_EQ(info.width, 192);
  EXPECT_EQ(info.stride, loaded.model->max_stride());
  EXPECT_EQ(info.names, options.names);
  EXPECT_EQ(info.input_name, "images");
  EXPECT_EQ(info.output_name, "output0");
}

TEST(OnnxInfo, ANonOnnxFileIsNamed) {
  const auto dir = std::filesystem::path(test::kBinaryDir) / "test-output" / "export";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "not-a-model.onnx").string();
  std::ofstream(path) << "hello";
  try {
    read_onnx_info(path);
    FAIL() << "a text file read as ONNX";
  } catch (const std::runtime_error& error) {
    EXPECT_NE(std::string(error.what()).find(path + ": not an ONNX model"), std::string::npos) << error.what();
  }
  EXPECT_THROW(read_onnx_info((dir / "missing.onnx").string()), std::runtime_error);
}

}  // namespace
}  // namespace yolo8
