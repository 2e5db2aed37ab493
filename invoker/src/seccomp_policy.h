// What an instance may ask of the kernel: the seccomp allow-list every
// sandboxed process runs under (sandbox.h installs it last, just before exec).
// Any other syscall kills the process (seccomp_log.h says which one it was).
//
// Thread safety: thread-safe; the filter is built once per process.
#ifndef SILT_INVOKER_SECCOMP_POLICY_H_
#define SILT_INVOKER_SECCOMP_POLICY_H_

#include <linux/filter.h>

#include "absl/status/status.h"

namespace silt::invoker {

// Builds the filter now (it is built once per process anyway); call at
// start-up so that the first instance start does not pay for it and errors
// show early.
absl::Status PrepareSeccomp();

// The filter, for PR_SET_SECCOMP. Only after PrepareSeccomp() returned OK;
// safe in a child between clone and exec (it allocates nothing then).
const sock_fprog& SeccompFilter();

}  // namespace silt::invoker

#endif  // SILT_INVOKER_SECCOMP_POLICY_H_
