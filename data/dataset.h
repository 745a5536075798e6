#pragma once
// YOLO-format datasets: data.yaml, image lists, label files, verification and the cached index.
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace yolo8::data {

struct DatasetSpec {
  std::string yaml_path;
  std::string root;                // resolved `path` (or the YAML's folder)
  std::vector<std::string> train;  // resolved split sources: folders, .txt lists or image files
  std::vector<std::string> val;
  std::vector<std::string> test;
  std::vector<std::string> names;  // index = class id
  int nc = 0;
};

// Reads a data.yaml; errors name the file, line and key.
DatasetSpec load_data_yaml(const std::string& yaml_path);

// Sorted candidate image files of a split (every regular file of the folders, the lines of .txt lists).
// Files with an unknown extension are kept so verification can report them.
std::vector<std::string> list_split_files(const std::vector<std::string>& sources);

// Image -> label path: last "/images/" becomes "/labels/", extension becomes ".txt".
std::string label_path_for(const std::string& image_path);

bool is_image_extension(const std::string& path);

// One object, class and normalised centre/size.
struct BoxLabel {
  float cls = 0.f;
  float cx = 0.f, cy = 0.f, w = 0.f, h = 0.f;
};

struct ImageRecord {
  std::string image;
  std::string label;
  int width = 0, height = 0;    // original size
  std::vector<BoxLabel> boxes;  // empty = background
};

// Why an image was left out (or, for kDuplicate / kPolygon / kJpegEndMarkerMissing, only noted).
enum class Problem {
  kImageMissing,
  kImageCorrupt,
  kImageTooSmall,
  kUnknownFormat,
  kLabelArity,
  kLabelClass,
  kLabelNonFinite,
  kLabelOutOfRange,
  kLabelSize,
  kLabelUnreadable,
  kDuplicate,             // not a skip: duplicate rows dropped
  kPolygon,               // not a skip: polygon rows turned into boxes
  kJpegEndMarkerMissing,  // not a skip: a JPEG whose image data is whole but lacks its end marker, used as it is
  kImageTruncated,        // a JPEG cut inside its image data: the missing rows would be grey under their labels
};
const char* problem_name(Problem p);
bool problem_skips_image(Problem p);

struct Issue {
  std::string file;
  int line = 0;  // 0 = whole file
  Problem problem = Problem::kImageCorrupt;
  std::string message;
};

struct CheckSummary {
  int64_t files = 0;   // candidate files found
  int64_t images = 0;  // usable images
  int64_t instances = 0;
  int64_t backgrounds = 0;     // usable images without objects (missing or empty label file)
  int64_t missing_labels = 0;  // of which without a label file
  int64_t duplicates_removed = 0;
  int64_t polygons_converted = 0;
  std::map<std::string, int64_t> skipped;  // problem name -> images skipped
  int64_t skipped_total() const;
};

struct DatasetIndex {
  std::vector<ImageRecord> records;  // usable images, sorted by path
  std::vector<Issue> issues;         // every problem once, in file order
  CheckSummary summary;
  int nc = 0;
  bool from_cache = false;
  std::string cache_path;
};

struct CheckOptions {
  int nc = 0;
  int workers = 8;                // verification threads (clamped to the hardware)
  bool use_cache = true;          // read/write the index in cache_dir (never inside the dataset)
  double coord_tolerance = 1e-3;  // normalised coordinates may exceed [0, 1] by this much
  std::string cache_tag;          // told apart in the index name: splits listed in .txt files share folders
  std::string cache_dir;          // "" = default_cache_dir()
  // Polled between files; when it answers true the check stops and build_index throws CheckCancelled (a run asked
  // to stop while a large dataset is being verified must not finish the verification first).
  std::function<bool()> cancelled;
};

// The check was cancelled through CheckOptions::cancelled; nothing is cached.
class CheckCancelled : public std::runtime_error {
 public:
  CheckCancelled() : std::runtime_error("dataset check cancelled") {}
};

// Where yolo8 keeps what it derives from a user's files: $YOLO8_CACHE_DIR, else $XDG_CACHE_HOME/yolo8, else
// ~/.cache/yolo8. Dataset indexes go to its datasets/ folder: a dataset folder is left as it was found, so
// Ultralytics never meets a `labels/<split>.cache` it cannot read, and read-only mounts still get a cache.
std::string default_cache_dir();

// The index file of the labels folder of `files` (absolute path hashed), e.g.
// <cache_dir>/datasets/val-3f2a9c0d41e6b7a8.index.
std::string index_cache_path(const std::vector<std::string>& files, const std::string& tag,
                             const std::string& cache_dir);

// Verifies every image and label of the given files (see list_split_files).
DatasetIndex build_index(const std::vector<std::string>& files, const CheckOptions& opts);

// Convenience: the split ("train", "val", "test") of a data.yaml.
DatasetIndex build_split_index(const DatasetSpec& spec, const std::string& split, const CheckOptions& opts);

// Prints the summary (and up to max_issues problems) of one split.
void print_report(std::ostream& os, const std::string& split, const DatasetIndex& index, size_t max_issues = 50);

// `yolo8 data check data=...`: checks train, val and test (those present); prints reports; returns whether every
// listed split keeps at least one usable image.
bool check_dataset(const std::string& yaml_path, std::ostream& os, int workers = 8, bool use_cache = true);

}  // namespace yolo8::data
