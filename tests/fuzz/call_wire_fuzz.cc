// The call port's frames (invoker/call_wire.h): what the gateway sends an
// invoker and what comes back, and the lease port's. Whatever the bytes, a
// parser says yes or no, never crashes; a frame it accepts, written out again,
// reads back the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>

#include "invoker/call_wire.h"

namespace cw = silt::invoker::call_wire;

namespace {

std::string_view Payload(const std::string& frame) {
  return std::string_view(frame).substr(4);
}

void Check(bool ok) {
  if (!ok) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::string_view key;
  if (cw::ParseHello(in, &key)) {
    std::string again;
    cw::AppendHello(&again, key);
    Check(Payload(again) == in);
  }
  cw::Request req;
  if (cw::ParseRequest(in, &req)) {
    std::string again;
    cw::AppendRequest(&again, req);
    Check(Payload(again) == in);
    uint32_t len;
    memcpy(&len, again.data(), 4);
    Check(len == again.size() - 4);
    Check(req.head == (in[0] == static_cast<char>(cw::Op::kRequestHead)));
  }
  cw::Reply reply;
  if (cw::ParseReply(in, &reply)) {  // a whole reply or a streamed one's head
    std::string again;
    cw::AppendReply(&again, reply);
    Check(Payload(again) == in);
    Check(reply.head == (in[0] == static_cast<char>(cw::Op::kReplyHead)));
  }
  std::string_view part;
  if (cw::ParseBodyPart(in, &part)) {
    std::string again;
    cw::AppendBodyPart(&again, part);
    Check(Payload(again) == in);
  }
  bool last = false;
  if (cw::ParseRequestPart(in, &part, &last)) {  // a request body's part or end
    std::string again;
    if (last) {
      cw::AppendBodyEnd(&again, part);
    } else {
      cw::AppendBodyPart(&again, part);
    }
    Check(Payload(again) == in);
  }
  // Leases.
  cw::LeaseAsk ask;
  if (cw::ParseLeaseAsk(in, &ask)) {
    std::string again;
    cw::AppendLeaseAsk(&again, ask);
    Check(Payload(again) == in);
  }
  cw::Leased leased;
  if (cw::ParseLeased(in, &leased)) {
    std::string again;
    cw::AppendLeased(&again, leased);
    Check(Payload(again) == in);
  }
  uint64_t id;
  if (cw::ParseNoLease(in, &id)) {
    std::string again;
    cw::AppendNoLease(&again, id);
    Check(Payload(again) == in);
  }
  if (cw::ParseRecall(in, &id)) {
    std::string again;
    cw::AppendRecall(&again, id);
    Check(Payload(again) == in);
  }
  cw::Return ret;
  if (cw::ParseReturn(in, &ret)) {
    std::string again;
    cw::AppendReturn(&again, ret);
    Check(Payload(again) == in);
  }
  cw::Returned returned;
  if (cw::ParseReturned(in, &returned)) {
    std::string again;
    cw::AppendReturned(&again, returned);
    Check(Payload(again) == in);
  }
  return 0;
}
