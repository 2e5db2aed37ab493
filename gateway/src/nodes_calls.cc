// Function calls: dispatch to a node's call port (call_client.h), retries
// on another node, calls parked while invokers reconnect, streamed bodies.
#include "nodes_impl.h"

namespace silt::gateway {

Clock::duration NodeRegistry::Impl::StartGrace() const {
  return options.node_timeout + std::chrono::seconds(2);
}

void NodeRegistry::Impl::FailParked(bool all) {
  std::vector<std::shared_ptr<Call>> failed;
  {
    std::lock_guard<std::mutex> l(mu);
    if (parked.empty() || (!all && Clock::now() < started + StartGrace()))
      return;
    failed.swap(parked);
  }
  for (auto& call : failed) {
    call->done(absl::UnavailableError(
        absl::StrCat("No endpoints available for: ", call->call.name, ".")));
  }
}

void NodeRegistry::Impl::Invoke(
    InvokeCall c, std::function<void(absl::StatusOr<InvokeResult>)> done) {
  auto call = std::make_shared<Call>();
  call->call = std::move(c);
  call->done = std::move(done);
  {
    std::lock_guard<std::mutex> l(mu);
    if (auto s = LoadFnsLocked(); !s.ok()) return call->done(s);
    auto it = fns.find(Key(call->call.ns, call->call.name));
    if (it == fns.end())
      return call->done(absl::NotFoundError(
          absl::StrCat("function ", call->call.name, " not found")));
    call->fn = it->second;
    ++calls[it->first];
  }
  cw::Request& r = call->request;
  r.name = call->call.name;
  r.ns = call->call.ns;
  r.generation = call->fn->spec.generation();
  r.call_id = call->call.call_id;
  r.method = std::move(call->call.method);
  r.path = std::move(call->call.path);
  r.query = std::move(call->call.query);
  r.headers = std::move(call->call.headers);
  r.body = std::move(call->call.body);
  r.timeout_ms = static_cast<uint32_t>(call->call.timeout.count());
  r.cold_start = call->call.cold_start;
  if (call->call.body_rest) {
    // Its body goes out as it comes and cannot be sent again: the node gets
    // the spec with it rather than asking for it.
    r.head = true;
    r.spec = call->fn->spec.SerializeAsString();
    call->with_spec = true;
  }
  Dispatch(call);
}

void NodeRegistry::Impl::Dispatch(std::shared_ptr<Call> call) {
  std::string key = Key(call->call.ns, call->call.name);
  {
    std::lock_guard<std::mutex> l(mu);
    call->node = PickLocked(key, *call->fn, call->tried);
    if (call->node) ++call->node->inflight[key];
    if (!call->node && call->tried.empty() && expect_nodes &&
        Clock::now() < started + StartGrace()) {
      parked.push_back(call);  // an invoker may be about to reconnect
      return;
    }
  }
  if (!call->node) {
    return call->done(absl::UnavailableError(
        absl::StrCat("No endpoints available for: ", call->call.name, ".")));
  }
  call->tried.push_back(call->node->name);
  Send(call);
}

void NodeRegistry::Impl::Send(std::shared_ptr<Call> call) {
  if (!call->frame) {
    // Straight to an instance leased from the node (one on this machine),
    // idle or soon; otherwise to its call port.
    if (call->node->leases && !call->request.head &&
        call->request.cold_start == cw::ColdStart::kAny) {
      CallClient::Done done = [this, call](absl::StatusOr<cw::Reply> r,
                                           std::shared_ptr<BodyStream> rest) {
        OnDone(call, r, std::move(rest));
      };
      // (A call that waited for a busy lease in vain: its call port.)
      std::function<void()> elsewhere = [this, call] {
        call->leased = false;
        SendToPort(call);
      };
      switch (call->node->leases->TryCall(call->request, done, elsewhere)) {
        case InstanceLeases::Took::kStarted:
          if (metrics) metrics->CallPath(true);
          call->leased = true;
          return;
        case InstanceLeases::Took::kWaits:
          call->leased = true;
          call->lease_waited = true;  // counted once it has its answer
          return;
        case InstanceLeases::Took::kNo:
          break;
      }
    }
  }
  SendToPort(std::move(call));
}

void NodeRegistry::Impl::SendToPort(std::shared_ptr<Call> call) {
  if (!call->frame) {
    if (metrics) metrics->CallPath(false);
    auto frame = std::make_shared<std::string>();
    cw::AppendRequest(frame.get(), call->request);
    call->request = cw::Request();
    call->frame = std::move(frame);
  }
  auto deadline = Clock::now() + call->call.timeout + std::chrono::seconds(2);
  call->node->calls->Call(
      call->frame, deadline,
      [this, call](absl::StatusOr<cw::Reply> r,
                   std::shared_ptr<BodyStream> rest) {
        OnDone(call, r, std::move(rest));
      },
      call->call.body_rest);
}

void NodeRegistry::Impl::SendWithSpec(std::shared_ptr<Call> call) {
  // The frame is rebuilt around the body it already holds.
  cw::Request full;
  if (!cw::ParseRequest(std::string_view(*call->frame).substr(4), &full))
    return call->done(absl::InternalError("cannot re-read a call frame"));
  full.spec = call->fn->spec.SerializeAsString();
  auto frame = std::make_shared<std::string>();
  cw::AppendRequest(frame.get(), full);
  call->frame = std::move(frame);
  call->with_spec = true;
  SendToPort(call);
}

void NodeRegistry::Impl::OnDone(std::shared_ptr<Call> call,
                                absl::StatusOr<cw::Reply>& r,
                                std::shared_ptr<BodyStream> rest) {
  std::string key = Key(call->call.ns, call->call.name);
  bool shutting_down;
  {
    std::lock_guard<std::mutex> l(stop_mu);
    shutting_down = stopping;
  }
  if (r.ok() && r->outcome == cw::Outcome::kNeedSpec && !call->with_spec &&
      !shutting_down)
    return SendWithSpec(std::move(call));
  {
    std::lock_guard<std::mutex> l(mu);
    --call->node->inflight[key];
    if (r.ok() && r->outcome == cw::Outcome::kAnswered && !call->leased) {
      control::InstanceCount& c = call->node->counts[key];
      c.set_name(call->call.name);
      c.set_namespace_(call->call.ns);
      c.set_generation(call->fn->spec.generation());
      c.set_ready(r->ready);
      c.set_busy(r->busy);
    }
  }
  absl::Status s = r.status();
  if (s.ok() && r->outcome == cw::Outcome::kError)
    s = absl::Status(static_cast<absl::StatusCode>(r->error_code), r->error);
  if (s.ok() && r->outcome == cw::Outcome::kNeedSpec)
    s = absl::InternalError(absl::StrCat("node ", call->node->name,
                                         " did not take function ",
                                         call->call.name, "'s spec"));
  if (absl::IsUnavailable(s) && call->tried.size() < 3 && !shutting_down) {
    // The node went away (or is not ready): try another one.
    fprintf(stderr, "silt-gateway: call to %s on node %s: %s; trying another\n",
            call->call.name.c_str(), call->node->name.c_str(),
            std::string(s.message()).c_str());
    call->node.reset();
    return Dispatch(std::move(call));
  }
  if (call->lease_waited && call->leased && metrics) metrics->CallPath(true);
  if (!s.ok()) return call->done(s);
  if (call->node->leases && !call->leased &&
      call->call.cold_start == cw::ColdStart::kAny)
    call->node->leases->AskAfterCall(call->call.ns, call->call.name,
                                     call->fn->spec.generation());
  InvokeResult out;
  out.status = r->status;
  out.headers = std::move(r->headers);
  out.body = std::move(r->body);
  out.start_tier = r->tier;
  out.start_ms = r->start_us / 1000.0;
  out.instance = std::move(r->instance);
  out.failure = r->failure;
  out.node = call->node->name;
  if (rest && !call->call.take_parts)
    return ReadWhole(std::move(rest),
                     std::make_shared<InvokeResult>(std::move(out)),
                     std::move(call->done));
  out.parts = std::move(rest);
  call->done(std::move(out));
}

void NodeRegistry::Impl::ReadWhole(
    std::shared_ptr<BodyStream> rest, std::shared_ptr<InvokeResult> out,
    std::function<void(absl::StatusOr<InvokeResult>)> done) {
  rest->Pull([rest, out, done = std::move(done)](
                 absl::StatusOr<BodyStream::Part> part) mutable {
    if (!part.ok()) return done(part.status());
    out->body += part->bytes;
    if (out->body.size() > kMaxWholeBody) {
      rest->Cancel();
      return done(absl::ResourceExhaustedError(
          absl::StrCat("the function's response is over ", kMaxWholeBody >> 20,
                       " MiB: too large to hold for an async callback")));
    }
    if (part->last) return done(std::move(*out));
    ReadWhole(std::move(rest), std::move(out), std::move(done));
  });
}

}  // namespace silt::gateway
