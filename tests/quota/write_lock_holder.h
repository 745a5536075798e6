#pragma once
// Another process's view of quotad's database holding SQLite's write lock (BEGIN IMMEDIATE): quotad's state changes
// then wait out their busy timeout and answer 503 with Retry-After, as in a storage stall.

#include <sqlite3.h>

#include <gtest/gtest.h>

#include <string>

namespace yolo8::test {

class WriteLockHolder {
 public:
  explicit WriteLockHolder(const std::string& db_path) {
    EXPECT_EQ(sqlite3_open(db_path.c_str(), &db_), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  }
  WriteLockHolder(const WriteLockHolder&) = delete;
  WriteLockHolder& operator=(const WriteLockHolder&) = delete;
  void release() {
    if (db_ == nullptr) return;
    sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
    sqlite3_close(db_);
    db_ = nullptr;
  }
  ~WriteLockHolder() { release(); }

 private:
  sqlite3* db_ = nullptr;
};

}  // namespace yolo8::test
