#include "quota/client/bearer_token.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace yolo8::quota {
namespace {

// The token in `path`, or "" with `error` set.
std::string read_token(const std::string& path, std::string& error) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error = "cannot read '" + path + "': " + std::strerror(errno);
    return "";
  }
  std::ostringstream text;
  text << in.rdbuf();
  const std::string token = token_of_file_text(text.str());
  if (token.empty()) error = "'" + path + "' holds no token";
  // a header value cannot carry a line break: a second line is a file made by mistake, not part of the token
  if (token.find_first_of("\r\n") != std::string::npos) {
    error = "'" + path + "' holds more than one line";
    return "";
  }
  return token;
}

}  // namespace

std::string token_of_file_text(const std::string& text) {
  std::string token = text;
  if (!token.empty() && token.back() == '\n') token.pop_back();
  if (!token.empty() && token.back() == '\r') token.pop_back();
  return token;
}

BearerToken::BearerToken(std::string token) : value_(std::move(token)) {}

std::shared_ptr<BearerToken> BearerToken::from_file(const std::string& path, const std::string& setting) {
  std::string error;
  std::string token = read_token(path, error);
  if (token.empty()) throw std::invalid_argument(setting + ": " + error);
  auto bearer = std::make_shared<BearerToken>(std::move(token));
  bearer->file_ = path;
  bearer->setting_ = setting;
  return bearer;
}

std::string BearerToken::value() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return value_;
}

bool BearerToken::reload(std::string* error) {
  if (file_.empty()) return false;
  std::string why;
  std::string token = read_token(file_, why);
  if (token.empty()) {
    if (error != nullptr) *error = why;
    return false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (token == value_) return false;
  value_ = std::move(token);
  return true;
}

}  // namespace yolo8::quota
