// Test helper: every field of two EncodeCounts equal.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "numerics/numerics.h"

namespace kvaudit::testing {

inline void expect_same_counts(const numerics::EncodeCounts& a, const numerics::EncodeCounts& b,
                               const std::string& what) {
  EXPECT_EQ(a.elements, b.elements) << what;
  EXPECT_EQ(a.saturated, b.saturated) << what;
  EXPECT_EQ(a.became_nan, b.became_nan) << what;
  EXPECT_EQ(a.became_inf, b.became_inf) << what;
  EXPECT_EQ(a.flushed_to_zero, b.flushed_to_zero) << what;
  EXPECT_EQ(a.subnormal, b.subnormal) << what;
  EXPECT_EQ(a.nonfinite_input, b.nonfinite_input) << what;
}

}  // namespace kvaudit::testing
