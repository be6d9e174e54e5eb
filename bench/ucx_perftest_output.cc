// Reading ucx_perftest's CSV summary (see ucx_perftest_output.h).
#include "bench/ucx_perftest_output.h"

#include <charconv>
#include <optional>
#include <string>
#include <vector>

namespace tierkv::bench {
namespace {

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() &&
         (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) {
    s.remove_suffix(1);
  }
  return s;
}

std::vector<std::string_view> SplitCommas(std::string_view line) {
  std::vector<std::string_view> out;
  for (;;) {
    const size_t comma = line.find(',');
    out.push_back(Trim(line.substr(0, comma)));
    if (comma == std::string_view::npos) return out;
    line.remove_prefix(comma + 1);
  }
}

std::optional<double> Number(std::string_view s) {
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

Status Unparsable(std::string_view why, std::string_view output) {
  return Status::InvalidArgument("ucx_perftest output: " + std::string(why) +
                                 ":\n" + std::string(output));
}

}  // namespace

Result<UcxPerftestResult> ParseUcxPerftestCsv(std::string_view output) {
  // The last header line and the first value line after it; UCX log lines
  // ("[1700000000.1] [host:pid:0] ... UCX WARN ...") may come anywhere.
  std::string_view header, values;
  std::string_view rest = output;
  bool after_header = false;
  while (!rest.empty()) {
    const size_t nl = rest.find('\n');
    const std::string_view line = Trim(rest.substr(0, nl));
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    if (line.empty() || line.front() == '[') continue;
    if (line.starts_with("iterations,")) {
      header = line;
      values = {};
      after_header = true;
    } else if (after_header) {
      values = line;
      after_header = false;
    }
  }
  if (header.empty() || values.empty()) {
    return Unparsable("no CSV header and value line (run with -f -v)", output);
  }
  const std::vector<std::string_view> names = SplitCommas(header);
  const std::vector<std::string_view> cells = SplitCommas(values);
  if (names.size() != cells.size()) {
    return Unparsable("header and values differ in length", output);
  }
  UcxPerftestResult r;
  int found = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const std::optional<double> v = Number(cells[i]);
    if (!v) return Unparsable("not a number: " + std::string(cells[i]), output);
    const std::string_view name = names[i];
    constexpr std::string_view kPercentileSuffix = "_percentile_lat";
    if (name == "iterations") {
      r.iterations = static_cast<uint64_t>(*v);
    } else if (name.ends_with(kPercentileSuffix)) {
      const std::optional<double> rank =
          Number(name.substr(0, name.size() - kPercentileSuffix.size()));
      if (!rank) return Unparsable("bad column " + std::string(name), output);
      r.percentile_rank = *rank;
      r.percentile_latency_us = *v;
    } else if (name == "avg_lat") {
      r.average_latency_us = *v;
    } else if (name == "overall_lat") {
      r.overall_latency_us = *v;
    } else if (name == "avg_bw") {
      r.average_bandwidth_mib_s = *v;
    } else if (name == "overall_bw") {
      r.overall_bandwidth_mib_s = *v;
    } else if (name == "avg_mr") {
      r.average_message_rate = *v;
    } else if (name == "overall_mr") {
      r.overall_message_rate = *v;
    } else {
      continue;  // a column a later UCX may add
    }
    ++found;
  }
  if (found != 8) return Unparsable("missing columns", output);
  return r;
}

}  // namespace tierkv::bench
