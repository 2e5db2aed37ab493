// CallMux: calls at once on one channel, against a fake worker on the other
// end of a socketpair that answers in the order the test says.
#include "call_mux.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "channel.h"
#include "common/process.h"
#include "gtest/gtest.h"

namespace silt::invoker {
namespace {

using Clock = CallMux::Clock;
using silt::testing::Eventually;
using std::chrono::milliseconds;

class CallMuxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int sv[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    invoker_ = sv[0];
    worker_ = sv[1];
    mux_ = std::make_unique<CallMux>(invoker_);
  }
  void TearDown() override {
    mux_.reset();
    close(invoker_);
    if (worker_ >= 0) close(worker_);
  }

  // The worker's side: reads one call.
  v1::WorkerCall Take() {
    v1::WorkerCall c;
    EXPECT_TRUE(ReadFrame(worker_, &c, std::chrono::seconds(5)).ok());
    return c;
  }
  void Answer(uint64_t seq, const std::string& body, bool more = false) {
    v1::WorkerReply r;
    r.set_seq(seq);
    r.set_body(body);
    r.set_more(more);
    ASSERT_TRUE(WriteFrame(worker_, r).ok());
  }

  // Sends a call with `body` and returns its seq.
  uint64_t Start(const std::string& body) {
    uint64_t seq = mux_->Begin();
    v1::WorkerCall c;
    c.set_body(body);
    EXPECT_TRUE(mux_->Send(seq, c).ok());
    return seq;
  }
  // Reads call `seq`'s frames until the last: their bodies joined.
  absl::StatusOr<std::string> Finish(uint64_t seq, milliseconds within) {
    std::string got;
    auto deadline = Clock::now() + within;
    while (true) {
      v1::WorkerReply r;
      absl::Status s = mux_->Next(seq, &r, deadline);
      if (!s.ok()) {
        mux_->End(seq);
        return s;
      }
      got += r.body();
      if (!r.more()) break;
    }
    mux_->End(seq);
    return got;
  }

  int invoker_ = -1, worker_ = -1;
  std::unique_ptr<CallMux> mux_;
};

TEST_F(CallMuxTest, EachCallGetsItsOwnFramesWhateverTheirOrder) {
  uint64_t a = Start("a"), b = Start("b"), c = Start("c");
  EXPECT_EQ(Take().seq(), a);
  EXPECT_EQ(Take().seq(), b);
  EXPECT_EQ(Take().seq(), c);
  auto fa = std::async(std::launch::async,
                       [&] { return Finish(a, milliseconds(5000)); });
  auto fb = std::async(std::launch::async,
                       [&] { return Finish(b, milliseconds(5000)); });
  auto fc = std::async(std::launch::async,
                       [&] { return Finish(c, milliseconds(5000)); });
  // Streamed parts of all three, interleaved, the last frames in reverse.
  Answer(b, "b1", true);
  Answer(a, "a1", true);
  Answer(c, "c1", true);
  Answer(b, "b2", true);
  Answer(c, "c2");
  Answer(b, "b3");
  Answer(a, "a2");
  EXPECT_EQ(*fa.get(), "a1a2");
  EXPECT_EQ(*fb.get(), "b1b2b3");
  EXPECT_EQ(*fc.get(), "c1c2");
}

// Many calls, answered in a shuffled order, part by part: none waits past its
// answer (whoever has the turn to read passes it on when it leaves).
TEST_F(CallMuxTest, ManyCallsAllGetTheirAnswers) {
  std::mt19937 rng(7);
  for (int round = 0; round < 50; ++round) {
    constexpr int kCalls = 16;
    std::vector<uint64_t> seqs;
    for (int i = 0; i < kCalls; ++i) seqs.push_back(Start("x"));
    for (int i = 0; i < kCalls; ++i) Take();
    std::vector<std::future<absl::StatusOr<std::string>>> done;
    for (uint64_t seq : seqs)
      done.push_back(std::async(std::launch::async, [this, seq] {
        return Finish(seq, milliseconds(10000));
      }));
    std::vector<std::pair<uint64_t, int>> frames;  // (seq, part)
    for (uint64_t seq : seqs)
      for (int part = 0; part < 3; ++part) frames.emplace_back(seq, part);
    std::shuffle(frames.begin(), frames.end(), rng);
    std::map<uint64_t, int> sent;
    for (auto [seq, unused] : frames) {
      int part = sent[seq]++;
      Answer(seq, std::to_string(part), part < 2);
    }
    for (auto& f : done) {
      auto got = f.get();
      ASSERT_TRUE(got.ok()) << "round " << round << ": " << got.status();
      EXPECT_EQ(*got, "012");
    }
  }
}

// A streamed reply whose call takes its parts slowly: the mux holds at most
// kMaxQueuedBytes of them (then nobody reads the channel: the worker's writes
// wait), and every call still gets its answer once the slow one reads on.
TEST_F(CallMuxTest, FramesHeldForASlowCallAreBounded) {
  uint64_t slow = Start("slow"), quick = Start("quick");
  Take();
  Take();
  constexpr int kParts = 40;  // 40 MiB, five times the bound
  std::atomic<bool> written{false};
  std::thread worker([&] {
    for (int i = 0; i < kParts; ++i)
      Answer(slow, std::string(1 << 20, static_cast<char>('a' + i % 26)),
             /*more=*/true);
    Answer(slow, "end");
    Answer(quick, "done");
    written = true;
  });
  // `quick` reads for both until the bound, then waits.
  auto fq = std::async(std::launch::async,
                       [&] { return Finish(quick, milliseconds(20000)); });
  size_t most = 0;
  std::string got;
  auto deadline = Clock::now() + milliseconds(20000);
  for (bool more = true; more;) {
    // Let the frames pile up to the bound before taking each one.
    ASSERT_TRUE(Eventually([&] {
      size_t queued = mux_->queued_bytes();
      most = std::max(most, queued);
      return queued >= CallMux::kMaxQueuedBytes || (written && queued > 0);
    })) << "the frames did not pile up: "
        << mux_->queued_bytes();
    v1::WorkerReply r;
    ASSERT_TRUE(mux_->Next(slow, &r, deadline).ok());
    got += r.body().substr(0, 1);
    more = r.more();
  }
  mux_->End(slow);
  worker.join();
  auto q = fq.get();
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(*q, "done");
  EXPECT_EQ(got.size(), kParts + 1u);
  EXPECT_LE(most, CallMux::kMaxQueuedBytes + (1u << 20) + 64);
  EXPECT_GE(most, CallMux::kMaxQueuedBytes);  // the bound, not less, was used
}

TEST_F(CallMuxTest, FramesOfAnEndedCallAreDropped) {
  uint64_t gone = Start("gone");
  uint64_t kept = Start("kept");
  Take();
  Take();
  // `gone` gives up first (its deadline passes): its late frames go nowhere.
  EXPECT_TRUE(
      absl::IsDeadlineExceeded(Finish(gone, milliseconds(20)).status()));
  Answer(gone, "late", true);
  Answer(gone, "late");
  Answer(kept, "mine");
  auto got = Finish(kept, milliseconds(5000));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "mine");
}

TEST_F(CallMuxTest, ACallWhoseTimeRunsOutHandsTheReadingOn) {
  uint64_t quick = Start("quick");
  uint64_t slow = Start("slow");
  Take();
  Take();
  // Whichever reads first: `quick` times out, `slow` still gets its answer
  // written after that.
  auto fs = std::async(std::launch::async,
                       [&] { return Finish(slow, milliseconds(5000)); });
  EXPECT_TRUE(
      absl::IsDeadlineExceeded(Finish(quick, milliseconds(50)).status()));
  Answer(slow, "done");
  auto got = fs.get();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "done");
}

TEST_F(CallMuxTest, AChannelThatBreaksFailsEveryCall) {
  uint64_t a = Start("a"), b = Start("b");
  auto fa = std::async(std::launch::async,
                       [&] { return Finish(a, milliseconds(5000)); });
  auto fb = std::async(std::launch::async,
                       [&] { return Finish(b, milliseconds(5000)); });
  Answer(a, "half", true);
  close(worker_);  // the instance died
  worker_ = -1;
  auto ra = fa.get(), rb = fb.get();
  EXPECT_FALSE(ra.ok());
  EXPECT_FALSE(rb.ok());
  EXPECT_FALSE(absl::IsDeadlineExceeded(ra.status())) << ra.status();
  EXPECT_FALSE(absl::IsDeadlineExceeded(rb.status())) << rb.status();
  // And so does a call that comes after.
  uint64_t c = mux_->Begin();
  v1::WorkerReply r;
  EXPECT_FALSE(mux_->Next(c, &r, Clock::now() + milliseconds(5000)).ok());
  mux_->End(c);
}

TEST_F(CallMuxTest, ACallWhoseCallerLeavesIsCancelled) {
  int watch[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, watch), 0);
  uint64_t a = Start("a");
  Take();
  auto fa = std::async(std::launch::async, [&] {
    v1::WorkerReply r;
    return mux_->Next(a, &r, Clock::now() + milliseconds(5000), watch[0]);
  });
  close(watch[1]);  // the caller's connection closed
  EXPECT_TRUE(absl::IsCancelled(fa.get()));
  mux_->End(a);
  close(watch[0]);
}

}  // namespace
}  // namespace silt::invoker
