#include "gpu_proclet.h"

#include <signal.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "gpu/channel.h"

namespace silt::invoker {

using wire::GpuOp;
using wire::StateCode;

namespace gpu_internal {

std::string Reply(StateCode code, std::string_view message) {
  std::string r(1, static_cast<char>(code));
  r.append(message);
  return r;
}

std::string MovedReply(const std::string& address) {
  std::string r(1, static_cast<char>(StateCode::kMoved));
  wire::Writer w(&r);
  w.Str(address);
  w.U64(0);
  return r;
}

StateCode CodeOf(std::string_view reply) {
  return reply.empty() ? StateCode::kInternal
                       : static_cast<StateCode>(static_cast<uint8_t>(reply[0]));
}

std::string ProcletKey(std::string_view ns, std::string_view function,
                       std::string_view name) {
  return absl::StrCat(Sv(ns), "/", Sv(function), "/", Sv(name));
}

bool ParseInfo(std::string_view reply, GpuProcletInfo* i) {
  if (CodeOf(reply) != StateCode::kOk) return false;
  wire::Reader r(reply.substr(1));
  std::string_view backend, device;
  if (!r.Str(&backend) || !r.Str(&device) || !r.U64(&i->memory_limit) ||
      !r.U64(&i->memory_used) || !r.U64(&i->launches) ||
      !r.U64(&i->generation) || !r.U64(&i->pending_limit) ||
      !r.U64(&i->busy_ns))
    return false;
  i->backend = backend;
  i->device = device;
  return true;
}

std::string PrecopyRequest(bool restart) {
  std::string request(1, static_cast<char>(GpuOp::kPrecopy));
  wire::Writer w(&request);
  w.U8(restart ? 1 : 0);
  w.U64(kPrecopyPartBytes);
  return request;
}

std::string MovingRequest(std::string_view backend, std::string_view device,
                          uint64_t memory_limit) {
  std::string request(1, static_cast<char>(GpuOp::kMoving));
  wire::Writer w(&request);
  w.Str(backend);
  w.Str(device);
  w.U64(memory_limit);
  return request;
}

double MsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now() - t)
      .count();
}

}  // namespace gpu_internal

using gpu_internal::ParseInfo;
using gpu_internal::Reply;

GpuProclets::Proclet::~Proclet() {
  {
    absl::MutexLock lock(&mu);
    EndLocked();
  }
  if (!dir.empty()) {
    umount2((dir + "/tmp").c_str(), MNT_DETACH);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
}

void GpuProclets::Proclet::EndLocked() {
  if (channel >= 0) close(channel);
  channel = -1;
  proc.reset();  // kills and reaps
}

std::string GpuProclets::Proclet::Exchange(std::string_view request,
                                           std::string_view more) {
  absl::MutexLock lock(&mu);
  return ExchangeLocked(request, more);
}

std::string GpuProclets::Proclet::ExchangeLocked(std::string_view request,
                                                 std::string_view more) {
  if (!moved_to.empty()) return gpu_internal::MovedReply(moved_to);
  if (lost || proc == nullptr)
    return Reply(StateCode::kLost,
                 "the GPU proclet's process ended; its buffers are lost");
  std::string reply;
  if (gpu::WriteFrame(channel, {request, more}) &&
      gpu::ReadFrame(channel, &reply) && !reply.empty())
    return reply;
  lost = true;
  int status = proc->Kill();
  std::string why =
      proc->cgroup().OomKilled() ? "out of memory"
      : WIFSIGNALED(status)
          ? absl::StrCat(
                "killed by signal ", WTERMSIG(status),
                WTERMSIG(status) == SIGSYS ? " (a forbidden system call)" : "")
          : absl::StrCat("exit status ", WEXITSTATUS(status));
  return Reply(StateCode::kLost,
               absl::StrCat("the GPU proclet ", name, " of ", function,
                            " ended (", why, "); its buffers are lost"));
}

GpuProcletInfo GpuProclets::Proclet::Info() {
  if (mu.TryLock()) {
    GpuProcletInfo i;
    if (moved_to.empty() && !lost &&
        ParseInfo(ExchangeLocked(std::string(1, char(GpuOp::kInfo))), &i)) {
      absl::MutexLock l(&info_mu);
      last = i;
    }
    mu.Unlock();
  }
  absl::MutexLock l(&info_mu);
  return last;
}

}  // namespace silt::invoker
