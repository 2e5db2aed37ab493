// A closed-loop HTTP load for the benchmarks: N keep-alive connections to
// 127.0.0.1:PORT, one thread each, each sending the next request as soon as
// the last answer is whole. Throughput and latency percentiles over the
// run; a connection that fails (or answers other than 200) is counted and
// made again.
#ifndef SILT_TESTS_COMMON_HTTP_LOAD_H_
#define SILT_TESTS_COMMON_HTTP_LOAD_H_

#include <cstdint>
#include <string>

namespace silt::testing {

struct LoadResult {
  double rps = 0, p50_us = 0, p99_us = 0;
  uint64_t errors = 0;
};

// A TCP connection to 127.0.0.1:PORT with TCP_NODELAY: its fd, or -1.
int Connect(int port);

// POSTs `body` (text/plain) to `path` for `seconds` on `concurrency`
// connections (each makes one call first, outside the measurement).
LoadResult Load(int port, const std::string& path, int concurrency,
                double seconds, const std::string& body = "Silt");

}  // namespace silt::testing

#endif  // SILT_TESTS_COMMON_HTTP_LOAD_H_
