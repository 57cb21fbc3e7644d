// Error plumbing shared by every module.
//
// Public functions that can fail for outside reasons return absl::Status or
// absl::StatusOr<T>. A broken invariant is a bug and aborts through LAIR_CHECK.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LAIR_CONCAT_INNER(a, b) a##b
#define LAIR_CONCAT(a, b) LAIR_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` is not OK.
#define LAIR_RETURN_IF_ERROR(expr)               \
  do {                                           \
    ::absl::Status lair_status_ = (expr);        \
    if (!lair_status_.ok()) return lair_status_; \
  } while (0)

// `LAIR_ASSIGN_OR_RETURN(auto x, MakeX());` declares x from a StatusOr, or
// returns its error.
#define LAIR_ASSIGN_OR_RETURN(lhs, expr) \
  LAIR_ASSIGN_OR_RETURN_IMPL(LAIR_CONCAT(lair_statusor_, __LINE__), lhs, expr)
// tmp names a variable and lhs may be a declaration ("auto x"), so neither
// can be parenthesized.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define LAIR_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                               \
  if (!tmp.ok()) return tmp.status();              \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)

// Aborts with file and line when an invariant does not hold.
#define LAIR_CHECK(cond)                                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)
