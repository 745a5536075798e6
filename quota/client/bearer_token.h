#pragma once
// The bearer token the client sends quotad: given as text, or read from a file (a mounted Kubernetes Secret)
// that may be rewritten while a training runs (a token rotation, quotad accepting the old and the new one).
#include <memory>
#include <mutex>
#include <string>

namespace yolo8::quota {

class BearerToken {
 public:
  // A token that never changes ("" sends no Authorization header).
  explicit BearerToken(std::string token = "");
  // The token in `path`, less a trailing newline. Throws std::invalid_argument naming `setting` and the file when
  // it cannot be read or holds no token.
  static std::shared_ptr<BearerToken> from_file(const std::string& path,
                                                const std::string& setting = "quota_token_file");

  std::string value() const;
  // The file it came from ("" when given as text).
  const std::string& file() const { return file_; }
  // After a 401: reads the file again; true when it now holds another token. False when given as text, or the
  // file is unchanged or unreadable (why in `error` when not null; the token stays as it was).
  bool reload(std::string* error = nullptr);

 private:
  mutable std::mutex mutex_;
  std::string value_;
  std::string file_;
  std::string setting_;
};

// A token file's text less one trailing newline (LF or CRLF); what `kubectl create secret --from-file` mounts.
std::string token_of_file_text(const std::string& text);

}  // namespace yolo8::quota
