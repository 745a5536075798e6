// Fuzz-style robustness of the native .pt reader: truncated and bit-flipped checkpoints must either load
// or throw a std::exception, never crash.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>
#include <random>

#include "golden_util.h"
#include "models/weights.h"

namespace yolo8 {
namespace {

// The intact checkpoint's architecture, built once: most flips leave it unchanged.
struct Reference {
  std::string yaml_text;
  DetectionModel model{nullptr};
};

Reference& reference(const std::string& bytes) {
  static Reference ref = [&] {
    const auto ck = read_ultralytics_checkpoint_bytes(bytes, "fuzz.pt");
    return Reference{YAML::Dump(ck.yaml), model_from_checkpoint(ck, "fuzz.pt").model};
  }();
  return ref;
}

// 1 = loaded, 0 = clean exception.
int attempt(const std::string& bytes, Reference* ref = nullptr) {
  try {
    const auto ck = read_ultralytics_checkpoint_bytes(bytes, "fuzz.pt");
    if (ref && YAML::Dump(ck.yaml) == ref->yaml_text && ck.nc == ref->model->nc()) {
      load_state_dict(*ref->model, ck.weights, "fuzz.pt");
      return 1;
    }
    const auto loaded = model_from_checkpoint(ck, "fuzz.pt");
    return loaded.model ? 1 : 0;
  } catch (const std::exception& e) {
    if (std::string(e.what()).empty()) ADD_FAILURE() << "exception without a message";
    return 0;
  }
}

class PtFuzz : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { bytes_ = new std::string(test::read_bytes(test::fixture("yolov8n-shapes.pt"))); }
  static void TearDownTestSuite() { delete bytes_; }
  static std::string* bytes_;
};
std::string* PtFuzz::bytes_ = nullptr;

TEST_F(PtFuzz, IntactFileLoads) { EXPECT_EQ(attempt(*bytes_), 1); }

TEST_F(PtFuzz, TruncatedAtManyOffsets) {
  const size_t n = bytes_->size();
  std::vector<size_t> offsets;
  for (size_t i = 0; i < 64; i += 7) offsets.push_back(i);
  for (size_t k = 1; k < 60; ++k) offsets.push_back(n * k / 60);
  for (size_t back = 1; back < 400; back += 23) offsets.push_back(n - back);
  int loaded = 0;
  for (size_t off : offsets) loaded += attempt(bytes_->substr(0, off));
  std::cout << offsets.size() << " truncations, " << loaded << " loaded\n";
  EXPECT_EQ(loaded, 0);  // the zip directory sits at the end: every cut must be refused
}

TEST_F(PtFuzz, BitFlipsAtManyPositions) {
  const size_t n = bytes_->size();
  const size_t pkl_end = bytes_->find("best/data/0");  // data.pkl is the first record
  ASSERT_NE(pkl_end, std::string::npos);
  std::mt19937 rng(1234);
  std::vector<size_t> positions;
  std::uniform_int_distribution<size_t> in_pickle(0, pkl_end), anywhere(0, n - 1), in_tail(n - 25000, n - 1);
  for (int i = 0; i < 260; ++i) positions.push_back(in_pickle(rng));
  for (int i = 0; i < 30; ++i) positions.push_back(anywhere(rng));
  for (int i = 0; i < 40; ++i) positions.push_back(in_tail(rng));
  int loaded = 0, refused = 0;
  Reference& ref = reference(*bytes_);
  for (size_t pos : positions) {
    std::string b = *bytes_;
    b[pos] = static_cast<char>(b[pos] ^ (1 << (pos % 8)));
    (attempt(b, &ref) ? loaded : refused)++;
  }
  std::cout << positions.size() << " bit flips: " << loaded << " loaded, " << refused << " refused\n";
  EXPECT_GT(refused, 0);
  EXPECT_EQ(loaded + refused, static_cast<int>(positions.size()));
}

// The state-dict path of load_model (same zip + pickle reader, different interpretation).
TEST(StateDictFuzz, TruncatedAndFlippedFilesLoadOrThrow) {
  const std::string bytes = test::read_bytes(test::fixture("yolov8n-shapes.state_dict.pt"));
  const std::string path = std::string(test::kBinaryDir) + "/fuzz_state_dict.pt";
  auto try_load = [&](const std::string& b) {
    std::ofstream(path, std::ios::binary | std::ios::trunc).write(b.data(), static_cast<std::streamsize>(b.size()));
    try {
      return load_model(path).model ? 1 : 0;
    } catch (const std::exception& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
      return 0;
    }
  };
  int loaded = 0;
  for (size_t k = 0; k < 30; ++k) loaded += try_load(bytes.substr(0, bytes.size() * k / 30));
  EXPECT_EQ(loaded, 0);
  const size_t pkl_end = bytes.find("state_dict/data/0");
  ASSERT_NE(pkl_end, std::string::npos);
  std::mt19937 rng(99);
  std::uniform_int_distribution<size_t> in_pickle(0, pkl_end), anywhere(0, bytes.size() - 1);
  int refused = 0, total = 0;
  for (int i = 0; i < 120; ++i, ++total) {
    const size_t pos = i < 100 ? in_pickle(rng) : anywhere(rng);
    std::string b = bytes;
    b[pos] = static_cast<char>(b[pos] ^ (1 << (pos % 8)));
    refused += 1 - try_load(b);
  }
  std::cout << total << " bit flips in the state-dict file: " << refused << " refused\n";
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace yolo8
