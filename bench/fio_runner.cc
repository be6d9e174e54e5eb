// Running fio and reading its JSON report, for benchmarks that compare
// tierkv's NVMe IO with fio's on the same file in the same run.
#include "bench/fio_runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

namespace tierkv::bench {

Result<Figure> RunFio(const std::string& fio, const std::string& workdir,
                      const std::string& args, const std::string& direction) {
  const std::string out = workdir + "/fio.json";
  const std::string log = workdir + "/fio.log";
  const std::string cmd = fmt::format(
      "{} --output-format=json --output={} {} >{} 2>&1", fio, out, args, log);
  const int rc = std::system(cmd.c_str());
  if (rc != 0) {
    std::ifstream in(log);
    std::string text((std::istreambuf_iterator<char>(in)), {});
    return Status::IOError(
        fmt::format("fio failed (status {}): {}\n{}", rc, cmd, text));
  }
  std::ifstream in(out);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  // fio may print notes before the JSON document.
  const size_t start = text.find('{');
  if (start == std::string::npos)
    return Status::IOError("fio wrote no JSON: " + cmd);
  nlohmann::json doc = nlohmann::json::parse(text.substr(start), nullptr,
                                             /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.contains("jobs") || doc["jobs"].empty()) {
    return Status::IOError("cannot parse fio JSON output of: " + cmd);
  }
  const nlohmann::json& job = doc["jobs"][0];
  if (job.value("error", 0) != 0) {
    return Status::IOError(
        fmt::format("fio job error {}: {}", job.value("error", 0), cmd));
  }
  const nlohmann::json& dir = job[direction];
  Figure f;
  f.bytes = dir.value("io_bytes", uint64_t{0});
  f.gbps = dir.value("bw_bytes", 0.0) / 1e9;
  f.iops = dir.value("iops", 0.0);
  f.cpu = (job.value("usr_cpu", 0.0) + job.value("sys_cpu", 0.0)) / 100.0;
  if (f.bytes == 0) return Status::IOError("fio transferred nothing: " + cmd);
  return f;
}

std::string FioArgs(const std::string& file, uint64_t region, uint64_t seg,
                    uint32_t qd, uint64_t bytes, double runtime_s,
                    const std::string& rw, const std::string& extra) {
  return fmt::format(
      "--name=tierkv-nvme-bench --filename={} --size={} --bs={} --iodepth={} "
      "--ioengine=io_uring --direct=1 --rw={} --io_size={} --runtime={} "
      "--numjobs=1 --norandommap --randrepeat=0 {}",
      file, region, seg, qd, rw, bytes,
      std::max(1, static_cast<int>(runtime_s)), extra);
}

}  // namespace tierkv::bench
