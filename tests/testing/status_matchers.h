// ASSERT_OK / EXPECT_OK for Status, Result<T> and PutResult, printing the
// error text.
#pragma once

#include <gtest/gtest.h>

#include "tierkv/client.h"
#include "tierkv/status.h"

namespace tierkv::testing {

inline Status ToStatus(const Status& s) { return s; }
// A deduplicated Put item is OK too (PutResult::already_stored).
inline Status ToStatus(const PutResult& r) { return r.status; }
template <typename T>
Status ToStatus(const Result<T>& r) {
  return r.status();
}

}  // namespace tierkv::testing

#define ASSERT_OK(expr)                                        \
  do {                                                         \
    ::tierkv::Status s_ = ::tierkv::testing::ToStatus((expr)); \
    ASSERT_TRUE(s_.ok()) << #expr << " -> " << s_.ToString();  \
  } while (0)
#define EXPECT_OK(expr)                                        \
  do {                                                         \
    ::tierkv::Status s_ = ::tierkv::testing::ToStatus((expr)); \
    EXPECT_TRUE(s_.ok()) << #expr << " -> " << s_.ToString();  \
  } while (0)
