#pragma once
// Read-only access to quotad's SQLite database for the reports (monthly, quarterly, history): one way to open it,
// prepare a query and read text, with errors that name the file.
#include <sqlite3.h>

#include <memory>
#include <stdexcept>
#include <string>

namespace yolo8::quota::read_db {

struct DbCloser {
  void operator()(sqlite3* db) const { sqlite3_close(db); }
};
struct QueryCloser {
  void operator()(sqlite3_stmt* query) const { sqlite3_finalize(query); }
};
using Db = std::unique_ptr<sqlite3, DbCloser>;
using Query = std::unique_ptr<sqlite3_stmt, QueryCloser>;

// Opens `path` read-only; a writer holding the lock is waited for up to 10 s.
inline Db open(const std::string& path) {
  sqlite3* raw = nullptr;
  if (sqlite3_open_v2(path.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    const std::string msg = raw ? sqlite3_errmsg(raw) : "out of memory";
    sqlite3_close(raw);
    throw std::runtime_error(path + ": cannot open the quota database: " + msg);
  }
  Db db(raw);
  sqlite3_busy_timeout(db.get(), 10000);
  return db;
}

inline Query prepare(sqlite3* db, const std::string& path, const char* sql) {
  sqlite3_stmt* query = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &query, nullptr) != SQLITE_OK) {
    throw std::runtime_error(path + ": not a quotad database (" + sqlite3_errmsg(db) + ")");
  }
  return Query(query);
}

inline std::string column_text(sqlite3_stmt* query, int column) {
  const unsigned char* value = sqlite3_column_text(query, column);
  return value == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(value));
}

}  // namespace yolo8::quota::read_db
