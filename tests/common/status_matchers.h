// StatusIs / IsOk matchers: Abseil 20220623 ships none.
//
//   EXPECT_THAT(ParseJobSpec(text), StatusIs(absl::StatusCode::kInvalidArgument,
//                                            HasSubstr("train.batch_size")));
#ifndef DDP_TESTS_COMMON_STATUS_MATCHERS_H_
#define DDP_TESTS_COMMON_STATUS_MATCHERS_H_

#include <ostream>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"

namespace ddp::testing {

inline const absl::Status& GetStatus(const absl::Status& s) { return s; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& s) {
  return s.status();
}

MATCHER_P2(StatusIs, code, message_matcher,
           std::string("has status code ") + absl::StatusCodeToString(code)) {
  const absl::Status& s = GetStatus(arg);
  if (s.code() != code) {
    *result_listener << "whose status is " << s;
    return false;
  }
  return ::testing::ExplainMatchResult(message_matcher, std::string(s.message()),
                                       result_listener);
}

MATCHER_P(StatusIs, code, std::string("has status code ") + absl::StatusCodeToString(code)) {
  const absl::Status& s = GetStatus(arg);
  if (s.code() != code) *result_listener << "whose status is " << s;
  return s.code() == code;
}

MATCHER(IsOk, "is OK") {
  const absl::Status& s = GetStatus(arg);
  if (!s.ok()) *result_listener << "whose status is " << s;
  return s.ok();
}

// A StatusOr<T> that is OK and whose value matches `value_matcher`.
MATCHER_P(IsOkAndHolds, value_matcher, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "whose status is " << arg.status();
    return false;
  }
  return ::testing::ExplainMatchResult(value_matcher, *arg, result_listener);
}

}  // namespace ddp::testing

#define DDP_ASSERT_OK_AND_ASSIGN(lhs, expr)                                    \
  DDP_ASSERT_OK_AND_ASSIGN_IMPL(DDP_TEST_CONCAT(_statusor_, __LINE__), lhs, expr)
#define DDP_TEST_CONCAT_INNER(a, b) a##b
#define DDP_TEST_CONCAT(a, b) DDP_TEST_CONCAT_INNER(a, b)
#define DDP_ASSERT_OK_AND_ASSIGN_IMPL(var, lhs, expr)                          \
  auto var = (expr);                                                           \
  ASSERT_TRUE(var.ok()) << var.status();                                       \
  lhs = std::move(var).value()

#endif  // DDP_TESTS_COMMON_STATUS_MATCHERS_H_
