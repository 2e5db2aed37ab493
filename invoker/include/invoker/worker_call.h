// A gateway call as its instance gets it: worker.proto's WorkerCall, built
// from the call's call_wire::Request. Shared by the invoker's call port and
// the gateway's leases (which write it to a lent instance themselves). Only
// .cc files include this (it pulls in the generated worker.pb.h).
#ifndef SILT_INVOKER_WORKER_CALL_H_
#define SILT_INVOKER_WORKER_CALL_H_

#include <utility>

#include "invoker/call_wire.h"
#include "invoker/proto/worker.pb.h"

namespace silt::invoker {

// The call's id, method, path, query, headers and body, moved out of `req`.
inline v1::WorkerCall TakeWorkerCall(call_wire::Request& req) {
  v1::WorkerCall call;
  call.set_call_id(std::move(req.call_id));
  call.set_method(std::move(req.method));
  call.set_path(std::move(req.path));
  call.set_query(std::move(req.query));
  for (auto& [k, v] : req.headers) {
    auto* h = call.add_headers();
    h->set_name(std::move(k));
    h->set_value(std::move(v));
  }
  call.set_body(std::move(req.body));
  return call;
}

}  // namespace silt::invoker

#endif  // SILT_INVOKER_WORKER_CALL_H_
