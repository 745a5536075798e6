#include "trainer/core/stop_signal.h"

#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <csignal>

#include "common/exit_codes.h"

namespace yolo8 {
namespace {

TEST(StopSignal, FirstSignalRequestsStopSecondMakesItUrgent) {
  reset_stop_state();
  install_stop_signal_handlers();
  EXPECT_FALSE(stop_requested());
  std::raise(SIGTERM);
  EXPECT_TRUE(stop_requested());
  EXPECT_EQ(stop_reason(), StopReason::kSignal);
  EXPECT_FALSE(stop_is_urgent());
  std::raise(SIGINT);
  EXPECT_TRUE(stop_is_urgent());
  EXPECT_EQ(stop_signal_count(), 2);
  reset_stop_state();
}

TEST(StopSignal, FirstReasonWins) {
  reset_stop_state();
  request_stop(StopReason::kLeaseRevoked);
  request_stop(StopReason::kTimeLimit);
  EXPECT_EQ(stop_reason(), StopReason::kLeaseRevoked);
  EXPECT_EQ(to_string(stop_reason()), "lease revoked");
  reset_stop_state();
}

TEST(StopSignal, ThirdSignalExitsWithPreemptedCode) {
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    install_stop_signal_handlers();
    for (int i = 0; i < 3; ++i) std::raise(SIGTERM);
    _exit(0);  // not reached when the third signal works
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), kExitPreempted);
}

}  // namespace
}  // namespace yolo8
