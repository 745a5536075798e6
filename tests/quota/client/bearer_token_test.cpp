// The bearer token from a file (a mounted Secret): read less its trailing newline, read again on demand, errors
// naming the setting and the file.
#include "quota/client/bearer_token.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>

namespace yolo8::quota {
namespace {

std::string temp_file(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/bearer_token_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

void write_text(const std::string& path, const std::string& text) { std::ofstream(path, std::ios::binary) << text; }

TEST(BearerToken, OneTrailingNewlineIsNotPartOfTheToken) {
  EXPECT_EQ(token_of_file_text("s3cret\n"), "s3cret");
  EXPECT_EQ(token_of_file_text("s3cret\r\n"), "s3cret");
  EXPECT_EQ(token_of_file_text("s3cret"), "s3cret");
  EXPECT_EQ(token_of_file_text("s3cret\n\n"), "s3cret\n");
}

TEST(BearerToken, AFileIsReadAgainAndSaysWhetherTheTokenChanged) {
  const std::string path = temp_file("token");
  write_text(path, "token-a\n");
  const auto token = BearerToken::from_file(path);
  EXPECT_EQ(token->value(), "token-a");
  EXPECT_EQ(token->file(), path);
  EXPECT_FALSE(token->reload()) << "unchanged";
  write_text(path, "token-b\n");
  EXPECT_TRUE(token->reload());
  EXPECT_EQ(token->value(), "token-b");
  // a file that cannot be read keeps the token it had and says why
  std::filesystem::remove(path);
  std::string error;
  EXPECT_FALSE(token->reload(&error));
  EXPECT_EQ(token->value(), "token-b");
  EXPECT_NE(error.find("cannot read '" + path + "'"), std::string::npos) << error;
  // text given as such never changes
  BearerToken fixed("token-c");
  EXPECT_FALSE(fixed.reload());
  EXPECT_EQ(fixed.value(), "token-c");
}

TEST(BearerToken, AMissingEmptyOrTwoLineFileIsAnErrorNamingTheSettingAndTheFile) {
  const std::string missing = temp_file("missing");
  std::filesystem::remove(missing);
  const std::string empty = temp_file("empty");
  write_text(empty, "\n");
  const std::string two_lines = temp_file("two-lines");
  write_text(two_lines, "token-a\ntoken-b\n");
  const std::pair<std::string, std::string> cases[] = {
      {missing, "quota_token_file: cannot read '" + missing + "': No such file or directory"},
      {empty, "quota_token_file: '" + empty + "' holds no token"},
      {two_lines, "quota_token_file: '" + two_lines + "' holds more than one line"},
  };
  for (const auto& [path, message] : cases) {
    try {
      BearerToken::from_file(path);
      ADD_FAILURE() << path << " was accepted";
    } catch (const std::invalid_argument& error) {
      EXPECT_EQ(std::string(error.what()), message);
    }
  }
}

}  // namespace
}  // namespace yolo8::quota
