// Propagation helpers for absl::Status / absl::StatusOr, as in TSL and Ray.
#ifndef DDP_COMMON_STATUS_MACROS_H_
#define DDP_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define DDP_STATUS_CONCAT_INNER(a, b) a##b
#define DDP_STATUS_CONCAT(a, b) DDP_STATUS_CONCAT_INNER(a, b)

// Returns the status from the enclosing function when `expr` is not OK.
#define DDP_RETURN_IF_ERROR(expr)                                              \
  do {                                                                         \
    ::absl::Status _ddp_status = (expr);                                       \
    if (!_ddp_status.ok()) return _ddp_status;                                 \
  } while (0)

// `DDP_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from an OK StatusOr, or
// returns its status.
#define DDP_ASSIGN_OR_RETURN(lhs, expr)                                        \
  DDP_ASSIGN_OR_RETURN_IMPL(DDP_STATUS_CONCAT(_ddp_statusor_, __LINE__), lhs, expr)

#define DDP_ASSIGN_OR_RETURN_IMPL(statusor, lhs, expr)                         \
  auto statusor = (expr);                                                      \
  if (!statusor.ok()) return std::move(statusor).status();                     \
  lhs = std::move(statusor).value()

#endif  // DDP_COMMON_STATUS_MACROS_H_
