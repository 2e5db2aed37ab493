// The restore plan: what silt-restorer needs to turn itself into a process
// that CRIU checkpointed, pre-digested from the CRIU image by the invoker
// (BuildRestorePlan in fast_restore.h). Plain data, no pointers: the invoker
// sends it over a socket and the restorer uses it after it has unmapped its
// own libc. x86-64 only.
//
// Layout: PlanHeader, then n_vmas PlanVma, n_runs PlanRun, n_files PlanFile,
// n_sigacts PlanSigaction.
#ifndef SILT_SNAPSHOT_RESTORE_PLAN_H_
#define SILT_SNAPSHOT_RESTORE_PLAN_H_

#include <cstdint>

namespace silt::snapshot {

inline constexpr uint32_t kPlanMagic = 0x53525031;  // "SRP1"
inline constexpr uint32_t kPlanMaxBytes = 4 << 20;
// silt-restorer's own image lives here (linked with -Ttext-segment); a target
// mapping that overlaps it cannot be restored this way.
inline constexpr uint64_t kRestorerBase = 0x50000000ull;
inline constexpr uint64_t kRestorerLimit = 0x58000000ull;
// Scratch place for the vDSO while it moves to the target's address.
inline constexpr uint64_t kRestorerScratch = 0x5c000000ull;
inline constexpr uint64_t kRestorerScratchLimit = kRestorerScratch + (1 << 20);

struct PlanHeader {
  uint32_t magic;
  uint32_t n_vmas;
  uint32_t n_runs;
  uint32_t n_files;
  uint32_t n_sigacts;
  uint32_t auxv_n;  // u64 words in auxv
  // General registers in struct sigcontext order: r8..r15, rdi, rsi, rbp,
  // rbx, rdx, rax, rcx, rsp, rip, eflags.
  uint64_t gpr[18];
  uint64_t cs, ss, fs_base, gs_base;
  uint8_t fxsave[512];  // legacy FXSAVE area (x87, SSE, MXCSR)
  uint64_t blocked;     // signal mask
  uint64_t clear_tid, robust_list, robust_len;
  uint64_t rseq, rseq_len, rseq_sig;
  uint64_t sas_sp, sas_size, sas_flags;
  // prctl(PR_SET_MM_MAP)
  uint64_t start_code, end_code, start_data, end_data, start_brk, brk,
      start_stack, arg_start, arg_end, env_start, env_end;
  uint64_t auxv[64];
  // vDSO and vvar (vvar may be [vvar] + [vvar_vclock]): 0 when absent.
  uint64_t vdso_start, vdso_end, vvar_start, vvar_end;
  char cwd[256];
};

// A mapping of the target. file < 0: anonymous.
struct PlanVma {
  uint64_t start, end;
  uint64_t pgoff;
  uint32_t prot, flags;  // PROT_*, MAP_* (without MAP_FIXED)
  int32_t file;
  uint32_t copy;  // 1 when some runs inside are copied (needs PROT_WRITE)
};

// Page contents from pages-N.img at `offset`: mapped privately (zero copy)
// when `map`, else copied (small runs, stacks).
struct PlanRun {
  uint64_t start, len, offset;
  uint32_t vma;  // index of the PlanVma it lies in
  uint32_t map;
};

struct PlanFile {
  char path[512];  // inside the sandbox
  uint64_t size;   // must match at restore
};

struct PlanSigaction {
  uint64_t signo, handler, flags, restorer, mask;
};

}  // namespace silt::snapshot

#endif  // SILT_SNAPSHOT_RESTORE_PLAN_H_
