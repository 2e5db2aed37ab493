// An HTTP endpoint for tests that receive calls: async callbacks. It listens on
// 127.0.0.1:0, keeps every request it gets and answers each with the status
// the test chose (200 by default).
#ifndef SILT_TESTS_COMMON_CALLBACK_SERVER_H_
#define SILT_TESTS_COMMON_CALLBACK_SERVER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace silt::testing {

struct ReceivedRequest {
  std::string method, target;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;
  std::string Header(absl::string_view name) const;
};

class CallbackServer {
 public:
  static absl::StatusOr<std::unique_ptr<CallbackServer>> Start();
  ~CallbackServer();

  std::string url() const;  // http://127.0.0.1:PORT/
  // The status the next requests get.
  void AnswerWith(int status) { status_ = status; }
  // Waits until `n` requests came (or the timeout); all received so far.
  std::vector<ReceivedRequest> WaitFor(size_t n,
                                       std::chrono::milliseconds timeout);
  std::vector<ReceivedRequest> Received() const;

 private:
  CallbackServer() = default;
  void Serve();
  void Handle(int fd);

  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<int> status_{200};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<ReceivedRequest> received_;
};

}  // namespace silt::testing

#endif  // SILT_TESTS_COMMON_CALLBACK_SERVER_H_
