// Letterbox against the reference's output, byte for byte.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <iterator>

#include "data/augment.h"
#include "test_paths.h"

namespace {

c10::impl::GenericDict load_fixture(const std::string& name) {
  std::ifstream in(std::string(yolo8::test::kFixturesDir) + "/" + name, std::ios::binary);
  EXPECT_TRUE(in.good()) << name;
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return torch::pickle_load(bytes).toGenericDict();
}

torch::Tensor get(const c10::impl::GenericDict& d, const std::string& key) {
  for (const auto& kv : d)
    if (kv.key().toStringRef() == key) return kv.value().toTensor().contiguous();
  ADD_FAILURE() << "missing key " << key;
  return {};
}

TEST(DataLetterboxGolden, MatchesReferenceByteForByte) {
  auto dict = load_fixture("letterbox_case.pt");
  torch::Tensor src = get(dict, "image_hwc_bgr");
  torch::Tensor expected = get(dict, "output_hwc_bgr");
  torch::Tensor shape = get(dict, "new_shape").to(torch::kLong);
  ASSERT_EQ(src.dim(), 3);
  cv::Mat img(static_cast<int>(src.size(0)), static_cast<int>(src.size(1)), CV_8UC3, src.data_ptr<uint8_t>());
  yolo8::data::LetterboxInfo info;
  cv::Mat out = yolo8::data::letterbox(img, static_cast<int>(shape[0].item<int64_t>()),
                                       static_cast<int>(shape[1].item<int64_t>()), true, &info);
  ASSERT_EQ(out.rows, expected.size(0));
  ASSERT_EQ(out.cols, expected.size(1));
  ASSERT_TRUE(out.isContinuous());
  torch::Tensor got = torch::from_blob(out.data, {out.rows, out.cols, 3}, torch::kUInt8);
  EXPECT_EQ(info.new_w, 256);
  EXPECT_EQ(info.new_h, 154);
  EXPECT_EQ(info.top, 51);
  EXPECT_EQ(torch::ne(got, expected).sum().item<int64_t>(), 0) << "pixels differ";
}

}  // namespace
