// silt-restorer: started by the invoker in a ready sandbox (namespaces,
// cgroup, mounts, credentials and seccomp of the function's worker) before any
// restore is asked for. It waits on fd 3 for a restore plan (restore_plan.h)
// and the image's pages file, then becomes the checkpointed worker:
//   1. with libc: open the mapped files, check everything that can fail,
//      map every target mapping that is clear of ours (and, when staged
//      ahead of calls, fill their page tables from the page cache),
//      install the target's mm fields, signal handlers; answer 'K' (or 'E' and
//      why, then exit), and wait for 'G' (all of this before any call needs
//      an instance);
//   2. on a stack in .bss, raw system calls only: unmap everything but
//      itself, move the vDSO to the target's address, map the rest of the
//      target's mappings (pages of the image mapped privately, small runs
//      copied),
//      rseq, robust list, TLS base;
//   3. rt_sigreturn into the target's registers.
// The binary is static and linked at kRestorerBase so that it stays out of
// the target's way. Any failure after 'K' exits with 100 + step: the invoker
// then restores with CRIU.
#include <fcntl.h>
#include <linux/prctl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/rseq.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "snapshot/restore_plan.h"

using namespace silt::snapshot;

namespace {

constexpr int kChannel = 3;
constexpr int kMaxFiles = 1024;
constexpr int kMaxRegions = 1024;

alignas(4096) char g_plan[kPlanMaxBytes];
alignas(64) char g_stack[256 << 10];
int g_files[kMaxFiles];
int g_pages = -1;
struct Region {
  uint64_t start, end;
};
Region g_unmap[kMaxRegions];
int g_n_unmap = 0;
Region g_vdso, g_vvar[2];
int g_n_vvar = 0;
const PlanHeader* g_h;
const PlanVma* g_vmas;
const PlanRun* g_runs;
// VMAs mapped (and their pages populated) while staged, out of the way of
// ours; Become() maps only the rest.
constexpr uint32_t kMaxVmas = 1 << 16;
bool g_premapped[kMaxVmas];
bool g_populate = false;
// Page tables filled ahead for at most this much of the image.
constexpr uint64_t kPopulateBudget = 1ull << 30;
uint64_t g_populated = 0;

// The kernel's rt_sigframe (x86-64).
struct KSigcontext {
  uint64_t gpr[18];  // r8..r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp, rip,
                     // eflags
  uint16_t cs, gs, fs, ss;
  uint64_t err, trapno, oldmask, cr2, fpstate, reserved[8];
};
struct KUcontext {
  uint64_t flags, link;
  uint64_t ss_sp;
  int32_t ss_flags, pad;
  uint64_t ss_size;
  KSigcontext mc;
  uint64_t sigmask;
};
struct KFrame {
  uint64_t pretcode;
  KUcontext uc;
  uint8_t info[128];
};
static_assert(sizeof(KSigcontext) == 256);
static_assert(offsetof(KUcontext, mc) == 40);
static_assert(offsetof(KUcontext, sigmask) == 296);
alignas(64) KFrame g_frame;
alignas(64) uint8_t g_fx[512];

[[noreturn]] void Fail(const char* what) {
  char msg[512];
  int n = snprintf(msg, sizeof(msg), "E%s (%s)", what, strerror(errno));
  if (n > 0) (void)!write(kChannel, msg, static_cast<size_t>(n));
  _exit(1);
}

// ---- phase 2: raw system calls only (no libc: %fs is about to change) ----

__attribute__((always_inline)) inline long Sys(long n, long a = 0, long b = 0,
                                               long c = 0, long d = 0,
                                               long e = 0, long f = 0) {
  long ret;
  register long r10 asm("r10") = d;
  register long r8 asm("r8") = e;
  register long r9 asm("r9") = f;
  asm volatile("syscall"
               : "=a"(ret)
               : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
               : "rcx", "r11", "memory");
  return ret;
}

[[noreturn]] __attribute__((noinline)) void Die(int step) {
  Sys(SYS_exit_group, 100 + step);
  __builtin_unreachable();
}

bool Failed(long r) { return r < 0 && r > -4096; }

// Maps VMA `i` and its page runs [first, end). Returns 0, the failed step,
// or -1 when (staged) the place is taken.
int MapVma(uint32_t i, uint32_t first, uint32_t end, bool populate) {
  const PlanVma& v = g_vmas[i];
  uint64_t len = v.end - v.start;
  uint32_t prot = v.prot | (v.copy ? PROT_READ | PROT_WRITE : 0);
  // While staged, never over something of ours (the survey says what is
  // free; NOREPLACE makes sure).
  uint32_t fixed = populate ? MAP_FIXED_NOREPLACE : MAP_FIXED;
  long r = v.file < 0
               ? Sys(SYS_mmap, v.start, len, prot, v.flags | fixed, -1, 0)
               : Sys(SYS_mmap, v.start, len, prot, v.flags | fixed,
                     g_files[v.file], v.pgoff);
  if (populate && r == -EEXIST) return -1;
  if (Failed(r)) return 4;
  if (static_cast<uint64_t>(r) != v.start) {
    Sys(SYS_munmap, r, len);
    return populate ? -1 : 4;
  }
  for (uint32_t k = first; k < end; ++k) {
    const PlanRun& pr = g_runs[k];
    if (pr.map) {
      if (Failed(Sys(SYS_mmap, pr.start, pr.len, v.prot,
                     MAP_PRIVATE | MAP_FIXED, g_pages, pr.offset)))
        return 5;
      continue;
    }
    uint64_t done = 0;
    while (done < pr.len) {
      long n = Sys(SYS_pread64, g_pages, pr.start + done, pr.len - done,
                   pr.offset + done);
      if (n <= 0) return 6;
      done += static_cast<uint64_t>(n);
    }
  }
  if (v.copy && prot != v.prot &&
      Failed(Sys(SYS_mprotect, v.start, len, v.prot)))
    return 7;
  // Page tables now, from the page cache: the first call takes no faults
  // on what the image holds (written pages still copy on write).
  if (populate && g_populate && v.prot != PROT_NONE &&
      g_populated + len <= kPopulateBudget && (v.file >= 0 || first < end)) {
    Sys(SYS_madvise, v.start, len, 22 /* MADV_POPULATE_READ */);
    g_populated += len;
  }
  return 0;
}

bool OursOverlap(uint64_t s, uint64_t e);

[[noreturn]] __attribute__((noinline)) void Become() {
  const PlanHeader& h = *g_h;
  // vDSO: to scratch first (the target's place may be where ours is now),
  // then to the target's address.
  if (h.vdso_start != 0) {
    Region* all[3] = {&g_vdso, &g_vvar[0], &g_vvar[1]};
    uint64_t base = g_vdso.start;
    for (int i = 0; i < g_n_vvar; ++i)
      if (g_vvar[i].start < base) base = g_vvar[i].start;
    for (int i = 0; i < 1 + g_n_vvar; ++i) {
      Region& r = *all[i];
      uint64_t to = kRestorerScratch + (r.start - base);
      if (Failed(Sys(SYS_mremap, r.start, r.end - r.start, r.end - r.start,
                     MREMAP_MAYMOVE | MREMAP_FIXED, to)))
        Die(1);
      r.end = to + (r.end - r.start);
      r.start = to;
    }
    uint64_t target =
        g_n_vvar && h.vvar_start < h.vdso_start ? h.vvar_start : h.vdso_start;
    for (int i = 0; i < 1 + g_n_vvar; ++i) {
      Region& r = *all[i];
      uint64_t to = target + (r.start - kRestorerScratch);
      if (Failed(Sys(SYS_mremap, r.start, r.end - r.start, r.end - r.start,
                     MREMAP_MAYMOVE | MREMAP_FIXED, to)))
        Die(2);
    }
  } else if (g_vdso.start) {
    Sys(SYS_munmap, g_vdso.start, g_vdso.end - g_vdso.start);
    for (int i = 0; i < g_n_vvar; ++i)
      Sys(SYS_munmap, g_vvar[i].start, g_vvar[i].end - g_vvar[i].start);
  }
  for (int i = 0; i < g_n_unmap; ++i)
    if (Failed(Sys(SYS_munmap, g_unmap[i].start,
                   g_unmap[i].end - g_unmap[i].start)))
      Die(3);

  // The target's memory (what was not mapped while staged).
  uint32_t run = 0;
  for (uint32_t i = 0; i < h.n_vmas; ++i) {
    uint32_t first = run;
    while (run < h.n_runs && g_runs[run].vma == i) ++run;
    if (g_premapped[i]) continue;
    if (int step = MapVma(i, first, run, /*populate=*/false)) Die(step);
  }

  // Thread state that lives in the target's memory.
  if (h.rseq && Failed(Sys(SYS_rseq, h.rseq, h.rseq_len, 0, h.rseq_sig)))
    Die(8);
  Sys(SYS_set_tid_address, h.clear_tid);
  if (h.robust_list) Sys(SYS_set_robust_list, h.robust_list, h.robust_len);
  if (Failed(Sys(SYS_close_range, kChannel, ~0u, 0))) {
    for (int fd = kChannel; fd < 1024; ++fd) Sys(SYS_close, fd);
  }
  if (Failed(Sys(SYS_arch_prctl, 0x1002 /* ARCH_SET_FS */, h.fs_base))) Die(9);
  if (h.gs_base) Sys(SYS_arch_prctl, 0x1001 /* ARCH_SET_GS */, h.gs_base);

  // Registers, signal mask and alternate stack: one rt_sigreturn.
  KFrame& f = g_frame;
  for (int i = 0; i < 18; ++i) f.uc.mc.gpr[i] = h.gpr[i];
  f.uc.mc.cs = static_cast<uint16_t>(h.cs);
  f.uc.mc.ss = static_cast<uint16_t>(h.ss);
  for (int i = 0; i < 512; ++i) g_fx[i] = h.fxsave[i];
  f.uc.mc.fpstate = reinterpret_cast<uint64_t>(g_fx);
  f.uc.sigmask = h.blocked;
  f.uc.ss_sp = h.sas_sp;
  f.uc.ss_flags = static_cast<int32_t>(h.sas_flags);
  f.uc.ss_size = h.sas_size;
  asm volatile(
      "mov %0, %%rsp\n"
      "mov %1, %%eax\n"
      "syscall\n" ::"r"(reinterpret_cast<char*>(&f) + 8),
      "i"(SYS_rt_sigreturn)
      : "memory");
  __builtin_unreachable();
}

// ---- phase 1: with libc ----

bool ReadAll(int fd, void* buf, size_t n) {
  auto* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void ReceivePlan() {
  // The pages file rides on the first byte; then u32 length, plan.
  char marker;
  iovec iov{&marker, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  if (recvmsg(kChannel, &msg, 0) != 1) _exit(0);  // invoker let us go
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  if (c == nullptr || c->cmsg_type != SCM_RIGHTS) Fail("no pages file");
  memcpy(&g_pages, CMSG_DATA(c), sizeof(int));
  char mode;  // 'P': staged ahead of calls, fill page tables too
  uint32_t len;
  if (!ReadAll(kChannel, &mode, 1)) Fail("short plan");
  g_populate = mode == 'P';
  if (!ReadAll(kChannel, &len, 4) || len < sizeof(PlanHeader) ||
      len > kPlanMaxBytes || !ReadAll(kChannel, g_plan, len))
    Fail("short plan");
  g_h = reinterpret_cast<const PlanHeader*>(g_plan);
  const PlanHeader& h = *g_h;
  size_t need = sizeof(PlanHeader) + h.n_vmas * sizeof(PlanVma) +
                h.n_runs * sizeof(PlanRun) + h.n_files * sizeof(PlanFile) +
                h.n_sigacts * sizeof(PlanSigaction);
  if (h.magic != kPlanMagic || need != len || h.n_files > kMaxFiles)
    Fail("bad plan");
  g_vmas = reinterpret_cast<const PlanVma*>(g_plan + sizeof(PlanHeader));
  g_runs = reinterpret_cast<const PlanRun*>(g_vmas + h.n_vmas);
}

bool Overlaps(uint64_t s, uint64_t e) {
  const PlanHeader& h = *g_h;
  for (uint32_t i = 0; i < h.n_vmas; ++i)
    if (s < g_vmas[i].end && e > g_vmas[i].start) return true;
  return (s < h.vdso_end && e > h.vdso_start) ||
         (s < h.vvar_end && e > h.vvar_start);
}

// Sorts our own mappings into: keep (the binary, its data and heap),
// move (vDSO, vvar), drop (the rest).
void SurveyMappings() {
  FILE* maps = fopen("/proc/self/maps", "re");
  if (!maps) Fail("cannot read /proc/self/maps");
  char line[512];
  while (fgets(line, sizeof(line), maps)) {
    unsigned long s, e;
    char name[256] = "";
    if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %255s", &s, &e, name) < 2)
      continue;
    if (strcmp(name, "[vsyscall]") == 0) continue;
    if (strcmp(name, "[vdso]") == 0) {
      g_vdso = {s, e};
    } else if (strncmp(name, "[vvar", 5) == 0) {
      if (g_n_vvar == 2) Fail("unexpected vvar layout");
      g_vvar[g_n_vvar++] = {s, e};
    } else if (s >= kRestorerBase && e <= kRestorerLimit) {
      continue;  // ourselves
    } else {
      if (g_n_unmap == kMaxRegions) Fail("too many mappings");
      g_unmap[g_n_unmap++] = {s, e};
    }
  }
  fclose(maps);
  const PlanHeader& h = *g_h;
  // The vDSO moves as one block: same sizes and the same distance to vvar.
  if (h.vdso_start) {
    if (!g_vdso.start) Fail("no vDSO here");
    uint64_t vvar_len = 0;
    for (int i = 0; i < g_n_vvar; ++i)
      vvar_len += g_vvar[i].end - g_vvar[i].start;
    if (g_vdso.end - g_vdso.start != h.vdso_end - h.vdso_start ||
        vvar_len != h.vvar_end - h.vvar_start ||
        (g_n_vvar &&
         (g_vdso.start - g_vvar[0].start != h.vdso_start - h.vvar_start)) ||
        (g_n_vvar == 2 && g_vvar[1].start != g_vvar[0].end))
      Fail("the vDSO differs from the image's (another kernel?)");
  }
  if (Overlaps(kRestorerBase, kRestorerLimit) ||
      Overlaps(kRestorerScratch, kRestorerScratchLimit))
    Fail("the image maps where the restorer lives");
}

bool OursOverlap(uint64_t s, uint64_t e) {
  auto hit = [&](const Region& r) { return s < r.end && e > r.start; };
  if (s < kRestorerLimit && e > kRestorerBase) return true;
  if (s < kRestorerScratchLimit && e > kRestorerScratch) return true;
  if (hit(g_vdso)) return true;
  for (int i = 0; i < g_n_vvar; ++i)
    if (hit(g_vvar[i])) return true;
  for (int i = 0; i < g_n_unmap; ++i)
    if (hit(g_unmap[i])) return true;
  return false;
}

// Maps now every target VMA that is clear of our own mappings (nearly all of
// them), so that 'G' only has to unmap us and jump.
void Premap() {
  const PlanHeader& h = *g_h;
  if (h.n_vmas > kMaxVmas) return;  // all in Become()
  uint32_t run = 0;
  for (uint32_t i = 0; i < h.n_vmas; ++i) {
    uint32_t first = run;
    while (run < h.n_runs && g_runs[run].vma == i) ++run;
    if (OursOverlap(g_vmas[i].start, g_vmas[i].end)) continue;
    int step = MapVma(i, first, run, /*populate=*/true);
    if (step < 0) continue;  // taken after all: Become() maps it
    if (step != 0) Fail("mapping the image");
    g_premapped[i] = true;
  }
}

// Asked while staged ('D': the node's resident budget wants the room back):
// drops the page tables Premap filled, keeping the mappings, so that the
// restore faults in only what its call touches, as one staged with 'M'
// would. VMAs with copied runs keep their pages (their contents are not in
// any file).
void Demote() {
  if (!g_populate || g_h->n_vmas > kMaxVmas) return;
  for (uint32_t i = 0; i < g_h->n_vmas; ++i)
    if (g_premapped[i] && !g_vmas[i].copy)
      madvise(reinterpret_cast<void*>(g_vmas[i].start),
              g_vmas[i].end - g_vmas[i].start, MADV_DONTNEED);
  g_populate = false;
}

void OpenFiles() {
  const auto* files = reinterpret_cast<const PlanFile*>(g_runs + g_h->n_runs);
  for (uint32_t i = 0; i < g_h->n_files; ++i) {
    g_files[i] = open(files[i].path, O_RDONLY | O_CLOEXEC);
    if (g_files[i] < 0) Fail(files[i].path);
    struct stat st;
    if (fstat(g_files[i], &st) != 0 ||
        (files[i].size && static_cast<uint64_t>(st.st_size) != files[i].size))
      Fail("a mapped file changed since the checkpoint");
  }
}

void InstallProcessState() {
  const PlanHeader& h = *g_h;
  if (chdir(h.cwd) != 0) Fail("chdir");
  const auto* files = reinterpret_cast<const PlanFile*>(g_runs + h.n_runs);
  const auto* sa = reinterpret_cast<const PlanSigaction*>(files + h.n_files);
  for (uint32_t i = 0; i < h.n_sigacts; ++i) {
    struct {
      uint64_t handler, flags, restorer, mask;
    } k{sa[i].handler, sa[i].flags, sa[i].restorer, sa[i].mask};
    if (syscall(SYS_rt_sigaction, sa[i].signo, &k, nullptr, 8) != 0)
      Fail("rt_sigaction");
  }
  // Our own rseq area goes with our TLS.
  if (__rseq_size > 0) {
    syscall(SYS_rseq,
            static_cast<char*>(__builtin_thread_pointer()) + __rseq_offset,
            __rseq_size, RSEQ_FLAG_UNREGISTER, RSEQ_SIG);
  }
  // Last: from here on brk() is the target's, so no more malloc.
  prctl_mm_map m{};
  m.start_code = h.start_code;
  m.end_code = h.end_code;
  m.start_data = h.start_data;
  m.end_data = h.end_data;
  m.start_brk = h.start_brk;
  m.brk = h.brk;
  m.start_stack = h.start_stack;
  m.arg_start = h.arg_start;
  m.arg_end = h.arg_end;
  m.env_start = h.env_start;
  m.env_end = h.env_end;
  m.auxv = reinterpret_cast<__u64*>(const_cast<uint64_t*>(h.auxv));
  m.auxv_size = h.auxv_n * 8;
  m.exe_fd = static_cast<uint32_t>(-1);
  if (prctl(PR_SET_MM, PR_SET_MM_MAP, &m, sizeof(m), 0) != 0)
    Fail("prctl(PR_SET_MM_MAP)");
}

}  // namespace

int main() {
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, nullptr);
  ReceivePlan();
  OpenFiles();
  SurveyMappings();
  Premap();
  InstallProcessState();
  // Staged: everything that can fail is done. 'G' (or the channel closing:
  // not needed after all) decides; 'D' may come first, any number of times.
  if (write(kChannel, "K", 1) != 1) _exit(1);
  for (char go = 0; go != 'G';) {
    if (read(kChannel, &go, 1) != 1) _exit(0);
    if (go == 'D')
      Demote();
    else if (go != 'G')
      _exit(0);
  }
  asm volatile(
      "mov %0, %%rsp\n"
      "call *%1\n" ::"r"(g_stack + sizeof(g_stack)),
      "r"(&Become)
      : "memory");
  __builtin_unreachable();
}
