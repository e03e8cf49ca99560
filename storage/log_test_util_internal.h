// Helpers shared by the request log's tests (log_file_test.cc, log_file_reuse_test.cc).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "storage/log_file_internal.h"

namespace tessera::internal {

/// Every record of `log` after `after`, as (seq, payload). The scan's status goes to `status`
/// when given, else the test fails on an error.
inline std::vector<std::pair<uint64_t, std::string>> ReadAll(LogFile& log, uint64_t after = 0,
                                                             Status* status = nullptr) {
  std::vector<std::pair<uint64_t, std::string>> out;
  Status s = log.Scan(after, [&](uint64_t seq, std::string_view p) {
    out.emplace_back(seq, std::string(p));
    return Status::OK();
  });
  if (status != nullptr) {
    *status = s;
  } else {
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return out;
}

}  // namespace tessera::internal
