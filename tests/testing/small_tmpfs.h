// SmallTmpfs: a tmpfs of a few MiB mounted on a fresh directory, which a
// test can fill to the last byte and empty again: a real "disk full" for
// RocksDB, io_uring and the daemon, without filling the machine's disk.
// Mounting needs CAP_SYS_ADMIN (root); Mount() says why when it cannot.
// Not thread-safe; one per test.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "tests/testing/temp_dir.h"
#include "tierkv/status.h"

namespace tierkv::testing {

class SmallTmpfs {
 public:
  // Mounts `bytes` of tmpfs on a new directory under $TMPDIR.
  static Result<std::unique_ptr<SmallTmpfs>> Mount(uint64_t bytes);
  // Unmounts (lazily, so an open file cannot make it fail).
  ~SmallTmpfs();
  SmallTmpfs(const SmallTmpfs&) = delete;
  SmallTmpfs& operator=(const SmallTmpfs&) = delete;

  const std::filesystem::path& path() const { return dir_.path(); }
  std::string File(const std::string& name) const { return dir_.File(name); }

  // Writes a filler file until the file system has no free block left
  // (ENOSPC). Returns the bytes written.
  uint64_t Fill();
  // Deletes the filler: the space is free again.
  void Unfill();
  // Free bytes now (statvfs).
  uint64_t FreeBytes() const;

 private:
  SmallTmpfs() = default;
  TempDir dir_;
  bool mounted_ = false;
};

}  // namespace tierkv::testing
