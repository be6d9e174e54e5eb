// fio as a same-run baseline for NVMe benchmarks (nvme_bench, load_bench).
#pragma once

#include <cstdint>
#include <string>

#include "tierkv/status.h"

namespace tierkv::bench {

// One measured direction of a run.
struct Figure {
  double gbps = 0;
  double iops = 0;
  double cpu = 0;  // CPU seconds per wall second
  uint64_t bytes = 0;
};

// Runs `fio` (its path) with `args` (a shell-safe list: the paths are ours)
// writing its JSON into `workdir`, and returns the job's figures for
// `direction` ("read" or "write"). IOError with fio's log on failure.
Result<Figure> RunFio(const std::string& fio, const std::string& workdir,
                      const std::string& args, const std::string& direction);

// Arguments of one io_uring O_DIRECT fio job over [0, region) of `file`:
// `rw` (write, randread, ...), block size `seg`, depth `qd`, `bytes` or
// `runtime_s`, whichever ends first.
std::string FioArgs(const std::string& file, uint64_t region, uint64_t seg,
                    uint32_t qd, uint64_t bytes, double runtime_s,
                    const std::string& rw, const std::string& extra = "");

}  // namespace tierkv::bench
