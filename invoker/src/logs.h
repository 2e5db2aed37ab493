// Instances' log lines: the book that keeps the last of them per function
// (what `faas-cli logs` / GET /system/logs reads, following new ones), and
// the collector that reads them from the instances' stdout and stderr.
//
// Thread safety: both are thread-safe.
#ifndef SILT_INVOKER_LOGS_H_
#define SILT_INVOKER_LOGS_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace silt::invoker {

// Nanoseconds since the Unix epoch.
int64_t WallNanos();

struct LogLine {
  int64_t ts;
  std::string instance;
  std::string text;
};

class LogBook {
 public:
  void Append(const std::string& fn_key, const std::string& instance,
              std::string text) {
    std::lock_guard<std::mutex> l(mu_);
    auto& q = lines_[fn_key];
    q.push_back({WallNanos(), instance, std::move(text)});
    ++seq_[fn_key];
    if (q.size() > kMaxLines) q.pop_front();
    cv_.notify_all();
  }

  // Lines after `since`, at most `tail` (the newest), then, with follow, new
  // ones until `stop` says so.
  template <typename Emit, typename Stop>
  void Read(const std::string& fn_key, int64_t since, int64_t tail, bool follow,
            Emit emit, Stop stop) {
    std::unique_lock<std::mutex> l(mu_);
    auto& q = lines_[fn_key];
    std::vector<LogLine> first;
    for (const auto& line : q)
      if (line.ts >= since) first.push_back(line);
    if (tail > 0 && first.size() > static_cast<size_t>(tail))
      first.erase(first.begin(), first.end() - tail);
    uint64_t seen = seq_[fn_key];
    l.unlock();
    for (const auto& line : first)
      if (!emit(line)) return;
    while (follow && !stop()) {
      l.lock();
      cv_.wait_for(l, std::chrono::milliseconds(200),
                   [&] { return seq_[fn_key] != seen; });
      uint64_t now = seq_[fn_key];
      std::vector<LogLine> fresh;
      auto& cur = lines_[fn_key];
      uint64_t n = std::min<uint64_t>(now - seen, cur.size());
      for (auto it = cur.end() - static_cast<long>(n); it != cur.end(); ++it)
        fresh.push_back(*it);
      seen = now;
      l.unlock();
      for (const auto& line : fresh)
        if (!emit(line)) return;
    }
  }

 private:
  static constexpr size_t kMaxLines = 10000;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::deque<LogLine>> lines_;
  std::map<std::string, uint64_t> seq_;
};

// Reads instances' stdout/stderr pipes and turns them into log lines, on a
// thread of its own.
class LogCollector {
 public:
  explicit LogCollector(LogBook* book);
  ~LogCollector();  // stops the thread, closes every pipe
  LogCollector(const LogCollector&) = delete;
  LogCollector& operator=(const LogCollector&) = delete;
  // Takes ownership of fd (a pipe's read end): its lines go to the book
  // under fn_key and instance until the other end closes.
  void Add(int fd, const std::string& fn_key, const std::string& instance);

 private:
  struct Source {
    std::string fn_key, instance, partial;
  };
  void Loop();
  LogBook* book_;
  int epfd_, wake_r_, wake_w_;
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  std::map<int, Source> sources_;
  std::thread thread_;
};

}  // namespace silt::invoker

#endif  // SILT_INVOKER_LOGS_H_
