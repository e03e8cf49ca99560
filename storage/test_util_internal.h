// Helpers shared by the storage tests: temporary directories and engine factories.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "storage/storage.h"

namespace tessera::internal {

/// A fresh directory under $TMPDIR (or /tmp), removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base != nullptr && *base != '\0' ? base : "/tmp") +
                       "/tessera_storage_test_XXXXXX";
    char* p = mkdtemp(tmpl.data());
    EXPECT_NE(p, nullptr) << "mkdtemp " << tmpl;
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  std::string Sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// Opens a RocksDB engine in `dir` with `options` (data_dir replaced); fails the test on error.
inline std::unique_ptr<StorageEngine> MustOpen(const std::string& dir,
                                               StorageOptions options = {}) {
  options.data_dir = dir;
  auto r = OpenStorageEngine(options);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

/// Opens lane `lane` of `lanes`; fails the test on error.
inline std::unique_ptr<LaneStore> MustLane(StorageEngine* engine, uint32_t lane = 0,
                                           uint32_t lanes = 1) {
  auto r = engine->OpenLane(lane, lanes);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

}  // namespace tessera::internal
