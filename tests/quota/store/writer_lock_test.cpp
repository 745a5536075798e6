// One writer per database: a second lock on the same database is refused naming the holder; the lock goes with its
// holder (here its destruction; for a process, its exit, however it exits).
#include "quota/store/writer_lock.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <stdexcept>
#include <string>

#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

TEST(WriterLock, ASecondWriterIsRefusedNamingTheFirst) {
  const std::string db = testing::temp_db("writer_lock");
  auto first = std::make_unique<WriterLock>(db);
  EXPECT_EQ(first->path(), db + ".lock");
  try {
    WriterLock second(db);
    ADD_FAILURE() << "two writers held " << db;
  } catch (const std::runtime_error& error) {
    const std::string what = error.what();
    EXPECT_NE(what.find("the database " + db + " is served by another quotad"), std::string::npos) << what;
    EXPECT_NE(what.find("pid " + std::to_string(::getpid()) + " on "), std::string::npos) << what;
  }
  // Another database is another lock.
  const WriterLock other(testing::temp_db("writer_lock_other"));
  first.reset();
  EXPECT_NO_THROW(WriterLock again(db));
}

}  // namespace
}  // namespace yolo8::quota
