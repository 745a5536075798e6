#include "data/dataset.h"

#include <opencv2/imgcodecs.hpp>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "data/image_io.h"

namespace yolo8::data {
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------------- data.yaml

namespace {

std::string yaml_where(const std::string& file, const YAML::Node& node, const std::string& key) {
  std::ostringstream os;
  os << file;
  if (node.IsDefined() && node.Mark().line >= 0) os << ":" << node.Mark().line + 1;
  os << ": key '" << key << "'";
  return os.str();
}

std::string resolve(const fs::path& base, const std::string& p) {
  fs::path q(p);
  if (q.is_relative()) q = base / q;
  return q.lexically_normal().string();
}

std::vector<std::string> read_split(const std::string& file, const YAML::Node& root, const std::string& key,
                                    const fs::path& base) {
  std::vector<std::string> out;
  YAML::Node n = root[key];
  if (!n.IsDefined() || n.IsNull()) return out;
  if (n.IsScalar()) {
    out.push_back(resolve(base, n.as<std::string>()));
  } else if (n.IsSequence()) {
    for (const auto& e : n) {
      if (!e.IsScalar()) throw std::runtime_error(yaml_where(file, e, key) + ": expected a path");
      out.push_back(resolve(base, e.as<std::string>()));
    }
  } else {
    throw std::runtime_error(yaml_where(file, n, key) + ": expected a path or a list of paths");
  }
  for (const auto& p : out)
    if (!fs::exists(p)) throw std::runtime_error(yaml_where(file, n, key) + ": '" + p + "' does not exist");
  return out;
}

}  // namespace

DatasetSpec load_data_yaml(const std::string& yaml_path) {
  if (!fs::is_regular_file(yaml_path)) throw std::runtime_error(yaml_path + ": data YAML not found");
  YAML::Node root;
  try {
    root = YAML::LoadFile(yaml_path);
  } catch (const YAML::Exception& e) {
    throw std::runtime_error(yaml_path + ":" + std::to_string(e.mark.line + 1) + ": YAML error: " + e.msg);
  }
  if (!root.IsMap()) throw std::runtime_error(yaml_path + ": expected a mapping at the top level");
  DatasetSpec spec;
  spec.yaml_path = yaml_path;
  fs::path yaml_dir = fs::absolute(fs::path(yaml_path)).parent_path();
  fs::path base = yaml_dir;
  try {
    if (root["path"] && root["path"].IsScalar()) {
      base = fs::path(resolve(yaml_dir, root["path"].as<std::string>()));
      if (!fs::is_directory(base))
        throw std::runtime_error(yaml_where(yaml_path, root["path"], "path") + ": '" + base.string() +
                                 "' is not a folder");
    }
    spec.root = base.string();
    spec.train = read_split(yaml_path, root, "train", base);
    spec.val = read_split(yaml_path, root, "val", base);
    spec.test = read_split(yaml_path, root, "test", base);
    if (spec.train.empty() && spec.val.empty())
      throw std::runtime_error(yaml_path + ": key 'train' or 'val' is required");

    YAML::Node names = root["names"];
    if (names.IsSequence()) {
      for (const auto& e : names) spec.names.push_back(e.as<std::string>());
    } else if (names.IsMap()) {
      std::map<int, std::string> by_id;
      for (const auto& kv : names) {
        int id = kv.first.as<int>();
        if (id < 0) throw std::runtime_error(yaml_where(yaml_path, kv.first, "names") + ": negative class id");
        by_id[id] = kv.second.as<std::string>();
      }
      int expect = 0;
      for (const auto& [id, name] : by_id) {
        if (id != expect)
          throw std::runtime_error(yaml_where(yaml_path, names, "names") + ": class ids must be 0..n-1, missing " +
                                   std::to_string(expect));
        spec.names.push_back(name);
        ++expect;
      }
    } else if (names.IsDefined() && !names.IsNull()) {
      throw std::runtime_error(yaml_where(yaml_path, names, "names") + ": expected a list or a mapping");
    }
    if (root["nc"]) {
      spec.nc = root["nc"].as<int>();
      if (spec.nc <= 0) throw std::runtime_error(yaml_where(yaml_path, root["nc"], "nc") + ": must be > 0");
      if (!spec.names.empty() && static_cast<int>(spec.names.size()) != spec.nc)
        throw std::runtime_error(yaml_where(yaml_path, root["nc"], "nc") + ": " + std::to_string(spec.nc) +
                                 " does not match the " + std::to_string(spec.names.size()) + " names");
      if (spec.names.empty())
        for (int i = 0; i < spec.nc; ++i) spec.names.push_back("class" + std::to_string(i));
    } else {
      if (spec.names.empty()) throw std::runtime_error(yaml_path + ": key 'names' (or 'nc') is required");
      spec.nc = static_cast<int>(spec.names.size());
    }
  } catch (const YAML::Exception& e) {
    throw std::runtime_error(yaml_path + ":" + std::to_string(e.mark.line + 1) + ": bad value: " + e.msg);
  }
  return spec;
}

// ---------------------------------------------------------------------------------------------------- file lists

bool is_image_extension(const std::string& path) {
  static const char* kExt[] = {"bmp", "dng", "jpeg", "jpg", "mpo", "png", "tif", "tiff", "webp", "pfm"};
  auto dot = path.find_last_of('.');
  auto slash = path.find_last_of('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return false;
  std::string e = path.substr(dot + 1);
  std::transform(e.begin(), e.end(), e.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* k : kExt)
    if (e == k) return true;
  return false;
}

std::vector<std::string> list_split_files(const std::vector<std::string>& sources) {
  std::vector<std::string> out;
  for (const auto& src : sources) {
    if (fs::is_directory(src)) {
      constexpr int kMaxDepth = 32;  // symlinked folders may form cycles
      const auto options =
          fs::directory_options::follow_directory_symlink | fs::directory_options::skip_permission_denied;
      for (auto it = fs::recursive_directory_iterator(src, options); it != fs::recursive_directory_iterator(); ++it) {
        const auto name = it->path().filename().string();
        const bool dir = it->is_directory();
        if (dir && it.depth() >= kMaxDepth) it.disable_recursion_pending();
        if (!name.empty() && name[0] == '.') {
          if (dir) it.disable_recursion_pending();
          continue;
        }
        if (!it->is_regular_file()) continue;
        // Label files kept beside their images and the side files the tools write are not candidates.
        const auto ext = it->path().extension().string();
        if (ext == ".txt" || ext == ".cache" || ext == ".npy" || ext == ".y8img" || ext.rfind(".tmp", 0) == 0) continue;
        out.push_back(it->path().lexically_normal().string());
      }
    } else if (fs::is_regular_file(src) && fs::path(src).extension() == ".txt") {
      std::ifstream in(src);
      if (!in) throw std::runtime_error(src + ": cannot read image list");
      fs::path parent = fs::path(src).parent_path();
      std::string line;
      while (std::getline(in, line)) {
        while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
        size_t b = 0;
        while (b < line.size() && std::isspace(static_cast<unsigned char>(line[b]))) ++b;
        line = line.substr(b);
        if (line.empty()) continue;
        if (line.rfind("./", 0) == 0) line = line.substr(2);
        out.push_back(resolve(parent, line));
      }
    } else if (fs::is_regular_file(src)) {
      out.push_back(fs::path(src).lexically_normal().string());
    } else {
      throw std::runtime_error(src + ": split source does not exist");
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string label_path_for(const std::string& image_path) {
  std::string p = image_path;
  const std::string a = "/images/";
  auto pos = p.rfind(a);
  if (pos != std::string::npos) p.replace(pos, a.size(), "/labels/");
  auto dot = p.find_last_of('.');
  auto slash = p.find_last_of('/');
  if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) p.erase(dot);
  return p + ".txt";
}

// ---------------------------------------------------------------------------------------------------- problems

const char* problem_name(Problem p) {
  switch (p) {
    case Problem::kImageMissing: return "image_missing";
    case Problem::kImageCorrupt: return "image_corrupt";
    case Problem::kImageTooSmall: return "image_too_small";
    case Problem::kUnknownFormat: return "unknown_format";
    case Problem::kLabelArity: return "label_arity";
    case Problem::kLabelClass: return "label_class";
    case Problem::kLabelNonFinite: return "label_non_finite";
    case Problem::kLabelOutOfRange: return "label_out_of_range";
    case Problem::kLabelSize: return "label_size";
    case Problem::kLabelUnreadable: return "label_unreadable";
    case Problem::kDuplicate: return "duplicate_rows";
    case Problem::kPolygon: return "polygon_rows";
    case Problem::kJpegEndMarkerMissing: return "jpeg_end_marker_missing";
    case Problem::kImageTruncated: return "image_truncated";
  }
  return "unknown";
}

bool problem_skips_image(Problem p) {
  return p != Problem::kDuplicate && p != Problem::kPolygon && p != Problem::kJpegEndMarkerMissing;
}

int64_t CheckSummary::skipped_total() const {
  int64_t n = 0;
  for (const auto& kv : skipped) n += kv.second;
  return n;
}

// ---------------------------------------------------------------------------------------------------- checks

namespace {

constexpr int kMinImageSide = 10;

struct FileResult {
  bool usable = false;
  ImageRecord record;
  std::vector<Issue> issues;
  bool missing_label = false;
  int duplicates = 0;
  int polygons = 0;
};

uint32_t be16(const unsigned char* p) { return (uint32_t(p[0]) << 8) | p[1]; }
uint32_t be32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | p[3];
}
int32_t le32(const unsigned char* p) {
  return static_cast<int32_t>(uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16) | (uint32_t(p[3]) << 24));
}

// Width/height from the file header of PNG, JPEG and BMP, so the index never needs a full decode for sizes.
bool header_size(const std::vector<unsigned char>& b, int& w, int& h) {
  const size_t n = b.size();
  if (n >= 24 && std::memcmp(b.data(), "\x89PNG\r\n\x1a\n", 8) == 0 && std::memcmp(b.data() + 12, "IHDR", 4) == 0) {
    w = static_cast<int>(be32(&b[16]));
    h = static_cast<int>(be32(&b[20]));
    return true;
  }
  if (n >= 26 && b[0] == 'B' && b[1] == 'M') {
    w = std::abs(le32(&b[18]));
    h = std::abs(le32(&b[22]));
    return true;
  }
  if (n >= 4 && b[0] == 0xFF && b[1] == 0xD8) {
    size_t i = 2;
    while (i + 9 < n) {
      if (b[i] != 0xFF) return false;
      unsigned char m = b[i + 1];
      if (m == 0xFF) {
        ++i;
        continue;
      }
      if (m == 0xD8 || m == 0x01 || (m >= 0xD0 && m <= 0xD7)) {
        i += 2;
        continue;
      }
      uint32_t len = be16(&b[i + 2]);
      bool sof = m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
      if (sof) {
        h = static_cast<int>(be16(&b[i + 5]));
        w = static_cast<int>(be16(&b[i + 7]));
        return true;
      }
      i += 2 + len;
    }
  }
  return false;
}

void check_image(const std::string& path, FileResult& r) {
  auto add = [&](Problem p, const std::string& msg) { r.issues.push_back({path, 0, p, msg}); };
  if (!is_image_extension(path)) {
    add(Problem::kUnknownFormat, "unknown image format (extension)");
    return;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    add(Problem::kImageMissing, "image file not found or unreadable");
    return;
  }
  std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.empty()) {
    add(Problem::kImageCorrupt, "empty image file");
    return;
  }
  // A reduced grayscale decode proves the file decodes at a fraction of the cost (JPEG scales in the DCT).
  cv::Mat small;
  try {
    small = cv::imdecode(bytes, cv::IMREAD_REDUCED_GRAYSCALE_8);
  } catch (const cv::Exception&) {
    small.release();
  }
  if (small.empty()) {
    add(Problem::kImageCorrupt, "image does not decode");
    return;
  }
  int w = 0, h = 0;
  if (header_size(bytes, w, h)) {
    // EXIF orientation swaps the sides in the decoded image; the reduced decode shows which.
    int rw = (w + 7) / 8, rh = (h + 7) / 8;
    if (rw != rh && small.cols == rh && small.rows == rw) std::swap(w, h);
  } else {
    cv::Mat full = cv::imdecode(bytes, cv::IMREAD_COLOR);
    if (full.empty()) {
      add(Problem::kImageCorrupt, "image does not decode");
      return;
    }
    w = full.cols;
    h = full.rows;
  }
  if (w < kMinImageSide || h < kMinImageSide) {
    add(Problem::kImageTooSmall,
        "image " + std::to_string(w) + "x" + std::to_string(h) + " is under " + std::to_string(kMinImageSide) + " px");
    return;
  }
  r.record.width = w;
  r.record.height = h;
  // libjpeg decodes a cut-off file with grey filling the rest: skip it, as the reference does. A file that only
  // lacks the end marker is whole; the reference rewrites it, we read it as it is and leave the file alone.
  switch (jpeg_ending(bytes)) {
    case JpegEnding::kScanDataMissing:
      add(Problem::kImageTruncated, "JPEG image data ends early (file cut off?): its missing rows would be grey");
      return;
    case JpegEnding::kEndMarkerMissing:
      add(Problem::kJpegEndMarkerMissing, "JPEG lacks its end marker but its image data is whole; used as it is");
      break;
    default: break;
  }
}

bool parse_number(const std::string& tok, double& v) {
  const char* s = tok.c_str();
  char* end = nullptr;
  v = std::strtod(s, &end);
  return end != s && *end == '\0';
}

void check_labels(const std::string& label, const CheckOptions& opts, FileResult& r) {
  std::error_code ec;
  if (!fs::exists(label, ec)) {
    r.missing_label = true;
    return;
  }
  std::ifstream in(label);
  if (!in) {
    r.issues.push_back({label, 0, Problem::kLabelUnreadable, "label file unreadable"});
    return;
  }
  const double tol = opts.coord_tolerance;
  std::string line;
  int line_no = 0;
  std::vector<std::array<double, 5>> rows;
  while (std::getline(in, line)) {
    ++line_no;
    std::istringstream ss(line);
    std::vector<std::string> toks;
    std::string t;
    while (ss >> t) toks.push_back(t);
    if (toks.empty()) continue;
    auto bad = [&](Problem p, const std::string& msg) { r.issues.push_back({label, line_no, p, msg}); };
    const size_t n = toks.size();
    const bool polygon = n > 5 && n % 2 == 1;
    if (n != 5 && !polygon) {
      bad(Problem::kLabelArity, "expected 5 values (class cx cy w h) or a polygon, got " + std::to_string(n));
      continue;
    }
    std::vector<double> v(n);
    bool numeric = true;
    for (size_t i = 0; i < n; ++i) numeric = numeric && parse_number(toks[i], v[i]);
    if (!numeric) {
      bad(Problem::kLabelNonFinite, "a value is not a number");
      continue;
    }
    if (!std::isfinite(v[0]) || v[0] < 0 || v[0] >= opts.nc || v[0] != std::floor(v[0])) {
      bad(Problem::kLabelClass, "class " + toks[0] + " not in [0, " + std::to_string(opts.nc) + ")");
      continue;
    }
    bool finite = true;
    for (size_t i = 1; i < n; ++i) finite = finite && std::isfinite(v[i]);
    if (!finite) {
      bad(Problem::kLabelNonFinite, "non-finite coordinate");
      continue;
    }
    bool inside = true;
    for (size_t i = 1; i < n; ++i) inside = inside && v[i] >= -tol && v[i] <= 1.0 + tol;
    if (!inside) {
      bad(Problem::kLabelOutOfRange, "coordinate outside [0, 1]");
      continue;
    }
    std::array<double, 5> row{};
    row[0] = v[0];
    if (polygon) {
      double x0 = 2, y0 = 2, x1 = -1, y1 = -1;
      for (size_t i = 1; i + 1 < n; i += 2) {
        x0 = std::min(x0, v[i]);
        x1 = std::max(x1, v[i]);
        y0 = std::min(y0, v[i + 1]);
        y1 = std::max(y1, v[i + 1]);
      }
      x0 = std::clamp(x0, 0.0, 1.0);
      x1 = std::clamp(x1, 0.0, 1.0);
      y0 = std::clamp(y0, 0.0, 1.0);
      y1 = std::clamp(y1, 0.0, 1.0);
      row = {v[0], (x0 + x1) / 2, (y0 + y1) / 2, x1 - x0, y1 - y0};
      ++r.polygons;
    } else {
      for (int i = 1; i < 5; ++i) row[i] = std::clamp(v[i], 0.0, 1.0);
    }
    if (!(row[3] > 0) || !(row[4] > 0)) {
      bad(Problem::kLabelSize, "box width and height must be > 0");
      continue;
    }
    if (std::find(rows.begin(), rows.end(), row) != rows.end()) {
      ++r.duplicates;
      r.issues.push_back({label, line_no, Problem::kDuplicate, "duplicate row dropped"});
      continue;
    }
    rows.push_back(row);
  }
  if (r.polygons > 0)
    r.issues.push_back({label, 0, Problem::kPolygon, std::to_string(r.polygons) + " polygon rows turned into boxes"});
  for (const auto& row : rows) {
    BoxLabel b;
    b.cls = static_cast<float>(row[0]);
    b.cx = static_cast<float>(row[1]);
    b.cy = static_cast<float>(row[2]);
    b.w = static_cast<float>(row[3]);
    b.h = static_cast<float>(row[4]);
    r.record.boxes.push_back(b);
  }
}

FileResult check_file(const std::string& path, const CheckOptions& opts) {
  FileResult r;
  r.record.image = path;
  r.record.label = label_path_for(path);
  check_image(path, r);
  if (std::none_of(r.issues.begin(), r.issues.end(), [](const Issue& i) { return problem_skips_image(i.problem); }))
    check_labels(r.record.label, opts, r);
  r.usable =
      std::none_of(r.issues.begin(), r.issues.end(), [](const Issue& i) { return problem_skips_image(i.problem); });
  return r;
}

// ---------------------------------------------------------------------------------------------------- cache

constexpr char kCacheMagic[8] = {'Y', '8', 'I', 'D', 'X', '0', '0', '4'};

uint64_t fnv1a(uint64_t h, const void* data, size_t n) {
  auto p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}
uint64_t fnv_str(uint64_t h, const std::string& s) { return fnv1a(fnv1a(h, s.data(), s.size()), "\0", 1); }
uint64_t fnv_i64(uint64_t h, int64_t v) { return fnv1a(h, &v, sizeof v); }

uint64_t stat_key(uint64_t h, const std::string& path) {
  std::error_code ec;
  auto st = fs::status(path, ec);
  if (ec || !fs::is_regular_file(st)) return fnv_i64(h, -1);
  auto size = fs::file_size(path, ec);
  auto mtime = fs::last_write_time(path, ec).time_since_epoch().count();
  return fnv_i64(fnv_i64(h, static_cast<int64_t>(size)), static_cast<int64_t>(mtime));
}

uint64_t index_key(const std::vector<std::string>& files, const CheckOptions& opts) {
  uint64_t h = 1469598103934665603ull;
  h = fnv_i64(h, opts.nc);
  h = fnv1a(h, &opts.coord_tolerance, sizeof opts.coord_tolerance);
  for (const auto& f : files) {
    h = stat_key(fnv_str(h, f), f);
    const auto l = label_path_for(f);
    h = stat_key(fnv_str(h, l), l);
  }
  return h;
}

struct Writer {
  std::ofstream& o;
  void i64(int64_t v) { o.write(reinterpret_cast<const char*>(&v), sizeof v); }
  void f32(float v) { o.write(reinterpret_cast<const char*>(&v), sizeof v); }
  void str(const std::string& s) {
    i64(static_cast<int64_t>(s.size()));
    o.write(s.data(), static_cast<std::streamsize>(s.size()));
  }
};
struct Reader {
  std::ifstream& in;
  int64_t i64() {
    int64_t v = 0;
    in.read(reinterpret_cast<char*>(&v), sizeof v);
    check();
    return v;
  }
  float f32() {
    float v = 0;
    in.read(reinterpret_cast<char*>(&v), sizeof v);
    check();
    return v;
  }
  std::string str() {
    int64_t n = i64();
    if (n < 0 || n > (1 << 20)) throw std::runtime_error("bad string");
    std::string s(static_cast<size_t>(n), '\0');
    in.read(s.data(), n);
    check();
    return s;
  }
  int64_t count() {
    int64_t n = i64();
    if (n < 0 || n > (int64_t(1) << 32)) throw std::runtime_error("bad count");
    return n;
  }
  void check() {
    if (!in) throw std::runtime_error("truncated");
  }
};

void save_cache(const std::string& path, uint64_t key, const DatasetIndex& idx) {
  std::string tmp = path + ".tmp" + std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  {
    std::error_code ignored;
    fs::create_directories(fs::path(path).parent_path(), ignored);
    std::ofstream o(tmp, std::ios::binary);
    if (!o) return;  // no writable cache folder: no cache, nothing wrong
    o.write(kCacheMagic, sizeof kCacheMagic);
    Writer w{o};
    w.i64(static_cast<int64_t>(key));
    w.i64(static_cast<int64_t>(idx.records.size()));
    for (const auto& r : idx.records) {
      w.str(r.image);
      w.str(r.label);
      w.i64(r.width);
      w.i64(r.height);
      w.i64(static_cast<int64_t>(r.boxes.size()));
      for (const auto& b : r.boxes) {
        w.f32(b.cls);
        w.f32(b.cx);
        w.f32(b.cy);
        w.f32(b.w);
        w.f32(b.h);
      }
    }
    w.i64(static_cast<int64_t>(idx.issues.size()));
    for (const auto& i : idx.issues) {
      w.str(i.file);
      w.i64(i.line);
      w.i64(static_cast<int64_t>(i.problem));
      w.str(i.message);
    }
    const auto& s = idx.summary;
    for (int64_t v :
         {s.files, s.images, s.instances, s.backgrounds, s.missing_labels, s.duplicates_removed, s.polygons_converted})
      w.i64(v);
    w.i64(static_cast<int64_t>(s.skipped.size()));
    for (const auto& kv : s.skipped) {
      w.str(kv.first);
      w.i64(kv.second);
    }
    if (!o) {
      std::error_code ec;
      fs::remove(tmp, ec);
      return;
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fs::remove(tmp, ec);
}

bool load_cache(const std::string& path, uint64_t key, DatasetIndex& idx) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  char magic[sizeof kCacheMagic];
  in.read(magic, sizeof magic);
  if (!in || std::memcmp(magic, kCacheMagic, sizeof magic) != 0) return false;
  try {
    Reader r{in};
    if (static_cast<uint64_t>(r.i64()) != key) return false;
    idx.records.resize(static_cast<size_t>(r.count()));
    for (auto& rec : idx.records) {
      rec.image = r.str();
      rec.label = r.str();
      rec.width = static_cast<int>(r.i64());
      rec.height = static_cast<int>(r.i64());
      rec.boxes.resize(static_cast<size_t>(r.count()));
      for (auto& b : rec.boxes) {
        b.cls = r.f32();
        b.cx = r.f32();
        b.cy = r.f32();
        b.w = r.f32();
        b.h = r.f32();
      }
    }
    idx.issues.resize(static_cast<size_t>(r.count()));
    for (auto& i : idx.issues) {
      i.file = r.str();
      i.line = static_cast<int>(r.i64());
      auto p = r.i64();
      if (p < 0 || p > static_cast<int64_t>(Problem::kImageTruncated)) return false;
      i.problem = static_cast<Problem>(p);
      i.message = r.str();
    }
    auto& s = idx.summary;
    for (int64_t* v : {&s.files, &s.images, &s.instances, &s.backgrounds, &s.missing_labels, &s.duplicates_removed,
                       &s.polygons_converted})
      *v = r.i64();
    int64_t n = r.count();
    for (int64_t k = 0; k < n; ++k) {
      auto name = r.str();
      s.skipped[name] = r.i64();
    }
  } catch (const std::exception&) {
    idx = DatasetIndex{};
    return false;
  }
  return true;
}

}  // namespace

std::string default_cache_dir() {
  const auto env = [](const char* name) {
    const char* value = std::getenv(name);
    return value != nullptr ? std::string(value) : std::string();
  };
  if (!env("YOLO8_CACHE_DIR").empty()) return env("YOLO8_CACHE_DIR");
  if (!env("XDG_CACHE_HOME").empty()) return (fs::path(env("XDG_CACHE_HOME")) / "yolo8").string();
  if (!env("HOME").empty()) return (fs::path(env("HOME")) / ".cache" / "yolo8").string();
  return (fs::temp_directory_path() / "yolo8-cache").string();
}

std::string index_cache_path(const std::vector<std::string>& files, const std::string& tag,
                             const std::string& cache_dir) {
  if (files.empty()) return {};
  std::error_code error;
  fs::path labels = fs::path(label_path_for(files.front())).parent_path();
  const fs::path absolute = fs::absolute(labels, error);
  if (!error) labels = absolute.lexically_normal();
  // FNV-1a: the same name on every machine and build for the same folder.
  uint64_t hash = 1469598103934665603ULL;
  for (const unsigned char c : labels.string() + "\n" + tag) {
    hash ^= c;
    hash *= 1099511628211ULL;
  }
  std::ostringstream name;
  name << labels.filename().string() << tag << "-" << std::hex << std::setw(16) << std::setfill('0') << hash
       << ".index";
  return (fs::path(cache_dir.empty() ? default_cache_dir() : cache_dir) / "datasets" / name.str()).string();
}

DatasetIndex build_index(const std::vector<std::string>& files, const CheckOptions& opts) {
  if (opts.nc <= 0) throw std::invalid_argument("nc: must be > 0 to check labels");
  DatasetIndex idx;
  idx.nc = opts.nc;
  uint64_t key = 0;
  if (opts.use_cache && !files.empty()) {
    idx.cache_path = index_cache_path(files, opts.cache_tag, opts.cache_dir);
    key = index_key(files, opts);
    if (load_cache(idx.cache_path, key, idx)) {
      idx.nc = opts.nc;
      idx.from_cache = true;
      return idx;
    }
  }
  std::vector<FileResult> results(files.size());
  std::atomic<size_t> next{0};
  std::atomic<bool> cancelled{false};
  auto work = [&]() {
    for (size_t i = next++; i < files.size() && !cancelled; i = next++) {
      if (opts.cancelled && opts.cancelled()) {
        cancelled = true;
        break;
      }
      results[i] = check_file(files[i], opts);
    }
  };
  unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  size_t n_threads =
      std::min<size_t>({static_cast<size_t>(std::max(1, opts.workers)), hw, std::max<size_t>(1, files.size())});
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n_threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (cancelled) throw CheckCancelled();

  auto& s = idx.summary;
  s.files = static_cast<int64_t>(files.size());
  for (auto& r : results) {
    for (auto& i : r.issues) idx.issues.push_back(std::move(i));
    s.duplicates_removed += r.duplicates;
    s.polygons_converted += r.polygons;
    if (!r.usable) {
      // The first skipping problem of the file names the reason.
      auto first = std::find_if(idx.issues.end() - static_cast<std::ptrdiff_t>(r.issues.size()), idx.issues.end(),
                                [](const Issue& i) { return problem_skips_image(i.problem); });
      s.skipped[problem_name(first->problem)]++;
      continue;
    }
    s.images++;
    s.instances += static_cast<int64_t>(r.record.boxes.size());
    if (r.record.boxes.empty()) s.backgrounds++;
    if (r.missing_label) s.missing_labels++;
    idx.records.push_back(std::move(r.record));
  }
  if (opts.use_cache && !files.empty()) save_cache(idx.cache_path, key, idx);
  return idx;
}

DatasetIndex build_split_index(const DatasetSpec& spec, const std::string& split, const CheckOptions& opts) {
  const std::vector<std::string>* src = split == "train"  ? &spec.train
                                        : split == "val"  ? &spec.val
                                        : split == "test" ? &spec.test
                                                          : nullptr;
  if (!src) throw std::invalid_argument("split: expected train, val or test, got '" + split + "'");
  if (src->empty()) throw std::runtime_error(spec.yaml_path + ": key '" + split + "' is not set");
  CheckOptions o = opts;
  o.nc = spec.nc;
  const bool listed = std::any_of(src->begin(), src->end(), [](const std::string& p) {
    return fs::path(p).extension() == ".txt" && fs::is_regular_file(p);
  });
  if (listed && o.cache_tag.empty()) o.cache_tag = "." + split;
  return build_index(list_split_files(*src), o);
}

void print_report(std::ostream& os, const std::string& split, const DatasetIndex& index, size_t max_issues) {
  size_t shown = 0;
  for (const auto& i : index.issues) {
    if (shown++ >= max_issues) {
      os << "  ... " << index.issues.size() - max_issues << " more problems\n";
      break;
    }
    os << "  " << (problem_skips_image(i.problem) ? "skip " : "note ") << i.file;
    if (i.line > 0) os << ":" << i.line;
    os << ": " << problem_name(i.problem) << ": " << i.message << "\n";
  }
  const auto& s = index.summary;
  os << split << ": " << s.files << " files, " << s.images << " images, " << s.instances << " instances, "
     << s.backgrounds << " backgrounds (" << s.missing_labels << " without label file), " << s.skipped_total()
     << " skipped";
  if (s.duplicates_removed) os << ", " << s.duplicates_removed << " duplicate rows dropped";
  if (s.polygons_converted) os << ", " << s.polygons_converted << " polygons as boxes";
  os << (index.from_cache ? " [cache]" : "") << "\n";
  for (const auto& kv : s.skipped) os << "  skipped " << kv.first << ": " << kv.second << "\n";
}

bool check_dataset(const std::string& yaml_path, std::ostream& os, int workers, bool use_cache) {
  DatasetSpec spec = load_data_yaml(yaml_path);
  CheckOptions opts;
  opts.workers = workers;
  opts.use_cache = use_cache;
  bool ok = true;
  for (const char* split : {"train", "val", "test"}) {
    const auto& src = std::string(split) == "train" ? spec.train : std::string(split) == "val" ? spec.val : spec.test;
    if (src.empty()) continue;
    DatasetIndex idx = build_split_index(spec, split, opts);
    print_report(os, split, idx);
    if (idx.records.empty()) {
      os << split << ": no usable images left\n";
      ok = false;
    }
  }
  return ok;
}

}  // namespace yolo8::data
