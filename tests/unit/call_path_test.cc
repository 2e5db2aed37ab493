// The gateway -> invoker call path in one process: the invoker's CallPort
// serving a handler, the gateway's CallClient on an io_context, over real TCP
// on loopback.
#include <atomic>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "call_client.h"
#include "call_port.h"
#include "gtest/gtest.h"
#include "invoker/call_wire.h"
#include "peer_wire.h"

namespace silt {
namespace {

namespace cw = invoker::call_wire;
using Clock = std::chrono::steady_clock;

TEST(CallWire, RequestAndReplyRoundTrip) {
  cw::Request r;
  r.ns = "openfaas-fn";
  r.name = "hello";
  r.generation = 7;
  r.call_id = "c";
  r.method = "PUT";
  r.path = "/x";
  r.query = "a=b";
  r.headers = {{"A", "1"}, {"B", ""}};
  r.body = std::string(100000, 'z');
  r.timeout_ms = 1234;
  r.cold_start = cw::ColdStart::kCriu;
  r.spec = "spec";
  std::string f;
  cw::AppendRequest(&f, r);
  cw::Request back;
  ASSERT_TRUE(cw::ParseRequest(std::string_view(f).substr(4), &back));
  EXPECT_EQ(back.name, "hello");
  EXPECT_EQ(back.generation, 7u);
  EXPECT_EQ(back.headers, r.headers);
  EXPECT_EQ(back.body, r.body);
  EXPECT_EQ(back.cold_start, cw::ColdStart::kCriu);
  EXPECT_EQ(back.spec, "spec");
  // Truncated anywhere: refused.
  for (size_t cut : {5ul, 40ul, f.size() - 1})
    EXPECT_FALSE(
        cw::ParseRequest(std::string_view(f).substr(4, cut - 4), &back));
  // A reply is not a request.
  std::string g;
  cw::AppendReply(&g, cw::Reply{});
  EXPECT_FALSE(cw::ParseRequest(std::string_view(g).substr(4), &back));
  cw::Reply rep;
  EXPECT_TRUE(cw::ParseReply(std::string_view(g).substr(4), &rep));
  EXPECT_EQ(cw::ParseColdStart("fork"), cw::ColdStart::kFork);
  EXPECT_EQ(cw::ParseColdStart("warm"), std::nullopt);
}

TEST(CallWire, StreamedReplyFrames) {
  cw::Reply head;
  head.head = true;
  head.status = 200;
  head.body = "first";
  std::string f;
  cw::AppendReply(&f, head);
  cw::Reply back;
  ASSERT_TRUE(cw::ParseReply(std::string_view(f).substr(4), &back));
  EXPECT_TRUE(back.head);
  EXPECT_EQ(back.body, "first");
  std::string_view bytes;
  EXPECT_FALSE(cw::ParseBodyPart(std::string_view(f).substr(4), &bytes));
  std::string g;
  cw::AppendBodyPart(&g, std::string("a\0b", 3));
  ASSERT_TRUE(cw::ParseBodyPart(std::string_view(g).substr(4), &bytes));
  EXPECT_EQ(bytes, std::string_view("a\0b", 3));
  EXPECT_FALSE(cw::ParseReply(std::string_view(g).substr(4), &back));
}

// A running checksum over bytes.
uint64_t Sum(std::string_view bytes, uint64_t sum) {
  for (unsigned char c : bytes) sum = sum * 131 + c;
  return sum;
}

// A request body of `parts` parts of `size` bytes each (byte i of the body
// is i * 7 mod 251), made as they are pulled, on a thread of their own (as a
// client's connection would answer); with `fail_at`, that part fails
// instead.
class MadeBody : public gateway::BodyStream {
 public:
  MadeBody(int parts, size_t size, int fail_at = -1)
      : parts_(parts), size_(size), fail_at_(fail_at) {}
  ~MadeBody() override {
    for (auto& t : threads_) t.join();
  }
  void Pull(Next next) override {
    int i = pulled_++;
    std::string bytes(size_, '\0');
    for (size_t k = 0; k < size_; ++k)
      bytes[k] = static_cast<char>(((i * size_ + k) * 7) % 251);
    std::lock_guard<std::mutex> l(mu_);
    threads_.emplace_back([=, this, bytes = std::move(bytes)]() mutable {
      if (i == fail_at_)
        return next(absl::CancelledError("the client went away"));
      next(Part{std::move(bytes), i + 1 == parts_});
    });
  }
  void Cancel() override { cancelled_ = true; }
  // What the whole body sums to (Sum over every part in order).
  uint64_t Expected() const {
    uint64_t sum = 0;
    for (size_t k = 0; k < parts_ * size_; ++k) {
      unsigned char c = static_cast<unsigned char>((k * 7) % 251);
      sum = sum * 131 + c;
    }
    return sum;
  }
  int pulled() const { return pulled_; }
  bool cancelled() const { return cancelled_; }

 private:
  const int parts_;
  const size_t size_;
  const int fail_at_;
  std::atomic<int> pulled_{0};
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::vector<std::thread> threads_;
};

class CallPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    key_.Set(std::string(32, 'k'));
    auto port = invoker::CallPort::Listen(
        "127.0.0.1:0", key_,
        [this](cw::Request& req, invoker::RequestBody* body, cw::Reply* reply,
               invoker::ReplyStream& stream) {
          if (req.path == "/upload") {
            // Reads the body part by part: its size and a checksum back.
            uint64_t size = req.body.size(), sum = Sum(req.body, 0);
            for (bool last = body == nullptr; !last;) {
              std::string_view part;
              if (absl::Status s = body->Next(&part, &last); !s.ok()) {
                reply->outcome = cw::Outcome::kError;
                reply->error = std::string(s.message());
                return;
              }
              sum = Sum(part, sum);
              size += part.size();
            }
            reply->status = 200;
            reply->body = absl::StrCat(size, " ", sum);
            return;
          }
          if (req.path == "/parts" || req.path == "/parts-broken") {
            cw::Reply head;
            head.status = 206;
            head.headers = {{"Content-Type", "text/event-stream"}};
            head.body = "head;";
            head.tier = cw::StartTier::kRestore;
            EXPECT_TRUE(stream.Head(head));
            for (int i = 0; i < 3; ++i)
              EXPECT_TRUE(stream.Part("part" + std::to_string(i) + ";"));
            if (req.path == "/parts-broken") {
              reply->outcome = cw::Outcome::kError;
              reply->error = "instance died";
              return;
            }
            reply->body = "end";
            return;
          }
          if (req.path == "/block") {
            std::unique_lock<std::mutex> l(mu_);
            cv_.wait(l, [&] { return released_; });
          }
          reply->status = 200;
          reply->headers = {{"X-Echo-Path", req.path}};
          reply->body = req.body + "!";
          reply->instance = "i-1";
          reply->tier = cw::StartTier::kFork;
          reply->ready = 3;
        });
    ASSERT_TRUE(port.ok()) << port.status();
    port_ = *std::move(port);
    io_thread_ = std::thread([this] { ioc_.run(); });
  }
  void TearDown() override {
    Release();
    client_.reset();
    port_.reset();
    work_.reset();
    ioc_.stop();
    io_thread_.join();
  }
  void Release() {
    std::lock_guard<std::mutex> l(mu_);
    released_ = true;
    cv_.notify_all();
  }

  // One call; with `upload`, its body streams: `body` in its head, the
  // rest pulled from `upload`.
  absl::StatusOr<cw::Reply> Call(
      gateway::CallClient& c, const std::string& path, std::string body = "hi",
      std::chrono::milliseconds timeout = std::chrono::seconds(10),
      std::shared_ptr<gateway::BodyStream> upload = nullptr) {
    cw::Request r;
    r.ns = "ns";
    r.name = "f";
    r.method = "POST";
    r.path = path;
    r.body = std::move(body);
    r.head = upload != nullptr;
    std::string frame;
    cw::AppendRequest(&frame, r);
    std::promise<absl::StatusOr<cw::Reply>> p;
    c.Call(
        std::make_shared<const std::string>(std::move(frame)),
        Clock::now() + timeout,
        [&](absl::StatusOr<cw::Reply> rep,
            std::shared_ptr<gateway::BodyStream> rest) {
          rest_ = std::move(rest);
          p.set_value(std::move(rep));
        },
        std::move(upload));
    return p.get_future().get();
  }

  // The next part of the streamed body the last call left in rest_.
  absl::StatusOr<gateway::BodyStream::Part> Pull() {
    std::promise<absl::StatusOr<gateway::BodyStream::Part>> p;
    rest_->Pull([&](absl::StatusOr<gateway::BodyStream::Part> part) {
      p.set_value(std::move(part));
    });
    return p.get_future().get();
  }

  invoker::DataKey key_;
  std::unique_ptr<invoker::CallPort> port_;
  boost::asio::io_context ioc_;
  std::optional<
      boost::asio::executor_work_guard<boost::asio::io_context::executor_type>>
      work_{ioc_.get_executor()};
  std::thread io_thread_;
  std::unique_ptr<gateway::CallClient> client_;
  std::shared_ptr<gateway::BodyStream> rest_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

TEST_F(CallPathTest, CallsGoAndComeBackOverKeptConnections) {
  gateway::CallClient c({&ioc_}, port_->address(), std::string(32, 'k'));
  for (int i = 0; i < 50; ++i) {
    auto r = Call(c, "/p", "body" + std::to_string(i));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->body, "body" + std::to_string(i) + "!");
    EXPECT_EQ(r->tier, cw::StartTier::kFork);
    EXPECT_EQ(r->ready, 3u);
    ASSERT_EQ(r->headers.size(), 1u);
    EXPECT_EQ(r->headers[0].second, "/p");
  }
  // A body larger than any socket buffer, both ways.
  std::string big(8 << 20, 'b');
  auto r = Call(c, "/big", big);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body.size(), big.size() + 1);
}

TEST_F(CallPathTest, AWrongKeyIsRefused) {
  gateway::CallClient c({&ioc_}, port_->address(), std::string(32, 'x'));
  auto r = Call(c, "/p");
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
}

TEST_F(CallPathTest, NoNodeThereIsUnavailable) {
  std::string addr = port_->address();
  port_.reset();  // nothing listens there now
  gateway::CallClient c({&ioc_}, addr, std::string(32, 'k'));
  auto r = Call(c, "/p");
  EXPECT_TRUE(absl::IsUnavailable(r.status())) << r.status();
  gateway::CallClient bad({&ioc_}, "not-an-address", std::string(32, 'k'));
  EXPECT_TRUE(absl::IsUnavailable(Call(bad, "/p").status()));
}

TEST_F(CallPathTest, NoAnswerByTheDeadlineIsDeadlineExceeded) {
  gateway::CallClient c({&ioc_}, port_->address(), std::string(32, 'k'));
  auto r = Call(c, "/block", "x", std::chrono::milliseconds(50));
  EXPECT_TRUE(absl::IsDeadlineExceeded(r.status())) << r.status();
  Release();
  // The client goes on with a new connection.
  auto again = Call(c, "/p");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->body, "hi!");
}

TEST_F(CallPathTest, CloseFailsCallsInFlight) {
  gateway::CallClient c({&ioc_}, port_->address(), std::string(32, 'k'));
  ASSERT_TRUE(Call(c, "/p").ok());
  std::promise<absl::StatusOr<cw::Reply>> p;
  cw::Request r;
  r.path = "/block";
  std::string frame;
  cw::AppendRequest(&frame, r);
  c.Call(
      std::make_shared<const std::string>(std::move(frame)),
      Clock::now() + std::chrono::seconds(30),
      [&](absl::StatusOr<cw::Reply> rep, std::shared_ptr<gateway::BodyStream>) {
        p.set_value(std::move(rep));
      });
  c.Close();
  auto got = p.get_future().get();
  EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
  // And later calls fail at once.
  EXPECT_TRUE(absl::IsUnavailable(Call(c, "/p").status()));
}

TEST_F(CallPathTest, AStreamedReplyIsPulledPartByPartThenTheConnectionIsKept) {
  gateway::CallClient c({&ioc_}, port_->address(), std::string(32, 'k'));
  auto head = Call(c, "/parts");
  ASSERT_TRUE(head.ok()) << head.status();
  ASSERT_NE(rest_, nullptr);
  EXPECT_TRUE(head->head);
  EXPECT_EQ(head->status, 206);
  EXPECT_EQ(head->body, "head;");
  EXPECT_EQ(head->tier, cw::StartTier::kRestore);
  std::string body;
  while (true) {
    auto part = Pull();
    ASSERT_TRUE(part.ok()) << part.status();
    body += part->bytes;
    if (part->last) break;
  }
  EXPECT_EQ(body, "part0;part1;part2;end");
  // The stream is over; the connection serves the next call.
  EXPECT_FALSE(Pull().ok());
  auto r = Call(c, "/p", "again");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(rest_, nullptr);
  EXPECT_EQ(r->body, "again!");
}

TEST_F(CallPathTest, AStreamedReplyThatBreaksOffIsAnErrorAtItsEnd) {
  gateway::CallClient c({&ioc_}, port_->address(), std::string(32, 'k'));
  ASSERT_TRUE(Call(c, "/parts-broken").ok());
  ASSERT_NE(rest_, nullptr);
  for (int i = 0; i < 3; ++i) {
    auto part = Pull();
    ASSERT_TRUE(part.ok()) << part.status();
    EXPECT_FALSE(part->last);
  }
  auto end = Pull();
  EXPECT_FALSE(end.ok());
  EXPECT_EQ(end.status().message(), "instance died");
  EXPECT_TRUE(Call(c, "/p").ok());
}

TEST(CallWire, StreamedRequestFrames) {
  cw::Request r;
  r.name = "f";
  r.body = "first";
  r.head = true;
  std::string f;
  cw::AppendRequest(&f, r);
  cw::Request back;
  ASSERT_TRUE(cw::ParseRequest(std::string_view(f).substr(4), &back));
  EXPECT_TRUE(back.head);
  EXPECT_EQ(back.body, "first");
  std::string_view bytes;
  bool last = true;
  EXPECT_FALSE(
      cw::ParseRequestPart(std::string_view(f).substr(4), &bytes, &last));
  std::string g, h;
  cw::AppendBodyPart(&g, "mid");
  cw::AppendBodyEnd(&h, std::string("e\0d", 3));
  ASSERT_TRUE(
      cw::ParseRequestPart(std::string_view(g).substr(4), &bytes, &last));
  EXPECT_EQ(bytes, "mid");
  EXPECT_FALSE(last);
  ASSERT_TRUE(
      cw::ParseRequestPart(std::string_view(h).substr(4), &bytes, &last));
  EXPECT_EQ(bytes, std::string_view("e\0d", 3));
  EXPECT_TRUE(last);
  // The end of a request body is not a part of a reply.
  EXPECT_FALSE(cw::ParseBodyPart(std::string_view(h).substr(4), &bytes));
}

// 64 MiB in 256 parts reach the handler part by part, checksummed; the
// connection then carries the next call.
TEST_F(CallPathTest, ARequestBodyStreamsPartByPart) {
  gateway::CallClient c({&ioc_}, port_->address(), std::string(32, 'k'));
  auto body = std::make_shared<MadeBody>(256, 256 << 10);
  auto r = Call(c, "/upload", "", std::chrono::seconds(30), body);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, absl::StrCat(uint64_t{64} << 20, " ", body->Expected()));
  EXPECT_EQ(body->pulled(), 256);
  auto again = Call(c, "/p", "x");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->body, "x!");
}

// A handler that answers without reading the body: the port reads the rest
// (the gateway sends all of it, then reads the answer), and the connection
// stays usable.
TEST_F(CallPathTest, ABodyTheHandlerIgnoresIsReadToItsEnd) {
  gateway::CallClient c({&ioc_}, port_->address(), std::string(32, 'k'));
  auto body = std::make_shared<MadeBody>(16, 1 << 20);
  auto r = Call(c, "/p", "head", std::chrono::seconds(30), body);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->body, "head!");
  EXPECT_EQ(body->pulled(), 16);
  EXPECT_TRUE(Call(c, "/p").ok());
}

// The client's body breaks off mid-way: the call fails with why, the handler
// sees its body break off, and later calls go on.
TEST_F(CallPathTest, ABodyThatBreaksOffFailsTheCall) {
  gateway::CallClient c({&ioc_}, port_->address(), std::string(32, 'k'));
  auto body = std::make_shared<MadeBody>(16, 1 << 20, /*fail_at=*/5);
  auto r = Call(c, "/upload", "", std::chrono::seconds(30), body);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsCancelled(r.status())) << r.status();
  EXPECT_EQ(body->pulled(), 6);
  EXPECT_TRUE(body->cancelled());
  EXPECT_TRUE(Call(c, "/p").ok());
}

TEST_F(CallPathTest, AConnectionClosedByTheNodeWhileIdleIsReplaced) {
  gateway::CallClient c({&ioc_}, port_->address(), std::string(32, 'k'));
  ASSERT_TRUE(Call(c, "/p").ok());  // leaves a kept connection
  // The node restarts on the same address: its old connections are gone.
  std::string addr = port_->address();
  port_.reset();
  auto port =
      invoker::CallPort::Listen(addr, key_,
                                [](cw::Request& req, invoker::RequestBody*,
                                   cw::Reply* reply, invoker::ReplyStream&) {
                                  reply->status = 201;
                                  reply->body = req.body;
                                });
  ASSERT_TRUE(port.ok()) << port.status();
  port_ = *std::move(port);
  auto r = Call(c, "/p");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 201);
}

}  // namespace
}  // namespace silt
