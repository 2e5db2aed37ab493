#include "common/http_load.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace silt::testing {
namespace {

using Clock = std::chrono::steady_clock;

// One request/response on a keep-alive connection; false on any error or
// non-200.
bool RoundTrip(int fd, const std::string& request, std::string& buf) {
  if (write(fd, request.data(), request.size()) !=
      static_cast<ssize_t>(request.size()))
    return false;
  buf.clear();
  size_t need = std::string::npos;
  char tmp[16384];
  while (true) {
    ssize_t r = read(fd, tmp, sizeof(tmp));
    if (r <= 0) return false;
    buf.append(tmp, static_cast<size_t>(r));
    if (need == std::string::npos) {
      size_t end = buf.find("\r\n\r\n");
      if (end == std::string::npos) continue;
      size_t len = 0;
      for (absl::string_view line :
           absl::StrSplit(buf.substr(0, end), "\r\n")) {
        if (line.size() > 15 &&
            strncasecmp(line.data(), "content-length:", 15) == 0)
          (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(15)),
                                 &len);
      }
      need = end + 4 + len;
    }
    if (buf.size() >= need) return buf.compare(9, 3, "200") == 0;
  }
}

}  // namespace

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

LoadResult Load(int port, const std::string& path, int concurrency,
                double seconds, const std::string& body) {
  std::string request =
      absl::StrCat("POST ", path, " HTTP/1.1\r\nHost: 127.0.0.1\r\n",
                   "Content-Type: text/plain\r\nContent-Length: ", body.size(),
                   "\r\n\r\n", body);
  // Warm up: every connection once, and a short burst.
  std::vector<std::vector<uint32_t>> lat(concurrency);
  std::atomic<uint64_t> errors{0};
  std::atomic<bool> go{false}, stop{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < concurrency; ++c) {
    threads.emplace_back([&, c] {
      int fd = Connect(port);
      std::string buf;
      if (fd < 0 || !RoundTrip(fd, request, buf)) ++errors;
      while (!go) std::this_thread::yield();
      while (!stop) {
        auto t0 = Clock::now();
        if (fd < 0 || !RoundTrip(fd, request, buf)) {
          ++errors;
          if (fd >= 0) close(fd);
          fd = Connect(port);
          continue;
        }
        lat[c].push_back(static_cast<uint32_t>(
            std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() -
                                                                  t0)
                .count()));
      }
      if (fd >= 0) close(fd);
    });
  }
  go = true;
  auto start = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  std::vector<uint32_t> all;
  for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
  std::sort(all.begin(), all.end());
  LoadResult r;
  r.errors = errors;
  if (all.empty()) return r;
  r.rps = static_cast<double>(all.size()) / elapsed;
  r.p50_us = all[all.size() / 2];
  r.p99_us = all[std::min(all.size() - 1, all.size() * 99 / 100)];
  return r;
}

}  // namespace silt::testing
