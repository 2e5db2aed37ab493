// The gateway -> invoker call path in one process: the invoker's CallPort
// serving a handler, the gateway's CallClient on an io_context, over real TCP
// on loopback.
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

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

class CallPathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    key_.Set(std::string(32, 'k'));
    auto port = invoker::CallPort::Listen(
        "127.0.0.1:0", key_,
        [this](cw::Request& req, cw::Reply* reply,
               invoker::ReplyStream& stream) {
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

  absl::StatusOr<cw::Reply> Call(
      gateway::CallClient& c, const std::string& path, std::string body = "hi",
      std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    cw::Request r;
    r.ns = "ns";
    r.name = "f";
    r.method = "POST";
    r.path = path;
    r.body = std::move(body);
    std::string frame;
    cw::AppendRequest(&frame, r);
    std::promise<absl::StatusOr<cw::Reply>> p;
    c.Call(std::make_shared<const std::string>(std::move(frame)),
           Clock::now() + timeout,
           [&](absl::StatusOr<cw::Reply> rep,
               std::shared_ptr<gateway::BodyStream> rest) {
             rest_ = std::move(rest);
             p.set_value(std::move(rep));
           });
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

TEST_F(CallPathTest, AConnectionClosedByTheNodeWhileIdleIsReplaced) {
  gateway::CallClient c({&ioc_}, port_->address(), std::string(32, 'k'));
  ASSERT_TRUE(Call(c, "/p").ok());  // leaves a kept connection
  // The node restarts on the same address: its old connections are gone.
  std::string addr = port_->address();
  port_.reset();
  auto port = invoker::CallPort::Listen(
      addr, key_,
      [](cw::Request& req, cw::Reply* reply, invoker::ReplyStream&) {
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
