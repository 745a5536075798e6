#pragma once
// A throwaway PostgreSQL 15 cluster for the tests of one binary (postgres_cluster_core.h): created at the first test
// that asks for a database (PostgresCluster::get()), stopped and removed when the binary ends (a GoogleTest
// Environment). A machine without PostgreSQL fails the test, naming scripts/setup.sh.
#include <gtest/gtest.h>

#include "tests/quota/postgres_cluster_core.h"

namespace yolo8::quota::testing {

// Stops the cluster when the binary's tests are done.
class PostgresEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { PostgresCluster::stop_if_started(); }
};
inline ::testing::Environment* const kPostgresEnvironment =
    ::testing::AddGlobalTestEnvironment(new PostgresEnvironment);

}  // namespace yolo8::quota::testing
