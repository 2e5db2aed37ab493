#include "snapshot/fast_restore.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "snapshot/restore_plan.h"

namespace silt::snapshot {
namespace {

// ---- protobuf wire format, just enough for CRIU's images ----

// One decoded message: field number -> values (varints and fixed as u64,
// length-delimited as bytes).
class Msg {
 public:
  static absl::StatusOr<Msg> Parse(std::string_view b) {
    Msg m;
    size_t i = 0;
    while (i < b.size()) {
      uint64_t key;
      if (!Varint(b, &i, &key)) return Bad();
      uint32_t field = static_cast<uint32_t>(key >> 3);
      switch (key & 7) {
        case 0: {
          uint64_t v;
          if (!Varint(b, &i, &v)) return Bad();
          m.ints_[field].push_back(v);
          break;
        }
        case 1:
          if (i + 8 > b.size()) return Bad();
          m.ints_[field].push_back(Fixed<uint64_t>(b.data() + i));
          i += 8;
          break;
        case 5:
          if (i + 4 > b.size()) return Bad();
          m.ints_[field].push_back(Fixed<uint32_t>(b.data() + i));
          i += 4;
          break;
        case 2: {
          uint64_t n;
          if (!Varint(b, &i, &n) || n > b.size() - i) return Bad();
          m.bytes_[field].push_back(b.substr(i, n));
          i += n;
          break;
        }
        default:
          return Bad();
      }
    }
    return m;
  }

  uint64_t U(uint32_t f, uint64_t def = 0) const {
    auto it = ints_.find(f);
    return it == ints_.end() || it->second.empty() ? def : it->second.back();
  }
  bool Has(uint32_t f) const { return ints_.contains(f) || bytes_.contains(f); }
  // Repeated scalars, packed or not.
  std::vector<uint64_t> Us(uint32_t f, bool fixed32 = false) const {
    std::vector<uint64_t> out;
    if (auto it = ints_.find(f); it != ints_.end()) out = it->second;
    if (auto it = bytes_.find(f); it != bytes_.end()) {
      for (std::string_view p : it->second) {
        size_t i = 0;
        while (i < p.size()) {
          uint64_t v = 0;
          if (fixed32) {
            if (i + 4 > p.size()) break;
            v = Fixed<uint32_t>(p.data() + i);
            i += 4;
          } else if (!Varint(p, &i, &v)) {
            break;
          }
          out.push_back(v);
        }
      }
    }
    return out;
  }
  std::string_view B(uint32_t f) const {
    auto it = bytes_.find(f);
    return it == bytes_.end() || it->second.empty() ? std::string_view()
                                                    : it->second.back();
  }
  std::vector<std::string_view> Bs(uint32_t f) const {
    auto it = bytes_.find(f);
    return it == bytes_.end() ? std::vector<std::string_view>() : it->second;
  }
  absl::StatusOr<Msg> Sub(uint32_t f) const { return Parse(B(f)); }

 private:
  static absl::Status Bad() {
    return absl::DataLossError("malformed protobuf in a CRIU image");
  }
  static bool Varint(std::string_view b, size_t* i, uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && *i < b.size(); shift += 7) {
      uint8_t c = static_cast<uint8_t>(b[(*i)++]);
      *v |= static_cast<uint64_t>(c & 0x7f) << shift;
      if (!(c & 0x80)) return true;
    }
    return false;
  }
  template <typename T>
  static T Fixed(const char* p) {
    T v;
    memcpy(&v, p, sizeof(v));
    return v;
  }

  std::map<uint32_t, std::vector<uint64_t>> ints_;
  std::map<uint32_t, std::vector<std::string_view>> bytes_;
};

// An image file: two magic words, then (u32 size, message) entries. The
// entries point into `data`, which stays put when the Image moves.
struct Image {
  std::unique_ptr<std::string> data;
  std::vector<std::string_view> entries;
};

absl::StatusOr<Image> ReadImage(const std::string& dir,
                                const std::string& name) {
  std::ifstream in(dir + "/" + name, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("image has no ", name));
  Image img;
  std::stringstream ss;
  ss << in.rdbuf();
  img.data = std::make_unique<std::string>(ss.str());
  std::string_view d = *img.data;
  if (d.size() < 8) return absl::DataLossError(name + " is truncated");
  size_t i = 8;
  while (i + 4 <= d.size()) {
    uint32_t n;
    memcpy(&n, d.data() + i, 4);
    i += 4;
    if (n > d.size() - i) return absl::DataLossError(name + " is truncated");
    img.entries.push_back(d.substr(i, n));
    i += n;
  }
  return img;
}

// The single entry of `name`; `keep` holds the bytes the Msg refers to.
absl::StatusOr<Msg> ReadOne(const std::string& dir, const std::string& name,
                            std::vector<Image>* keep) {
  auto img = ReadImage(dir, name);
  if (!img.ok()) return img.status();
  if (img->entries.size() != 1)
    return absl::DataLossError(absl::StrCat(name, ": expected one entry"));
  keep->push_back(*std::move(img));
  return Msg::Parse(keep->back().entries[0]);
}

absl::Status Refuse(absl::string_view why) {
  return absl::UnimplementedError(
      absl::StrCat("not restorable without CRIU: ", why));
}

// CRIU's VMA status bits (criu/include/image.h).
constexpr uint32_t kAreaRegular = 1 << 0, kAreaVsyscall = 1 << 2,
                   kAreaVdso = 1 << 3, kFilePrivate = 1 << 6,
                   kFileShared = 1 << 7, kAnonShared = 1 << 8,
                   kAnonPrivate = 1 << 9, kAreaVvar = 1 << 12,
                   kUnusual = (1 << 10) | (1 << 11) | (1 << 13) | (1 << 14) |
                              (1 << 15) | (1 << 27) | (1u << 31);
constexpr uint32_t kPresent = 1 << 2, kInParent = 1 << 0;
constexpr uint64_t kPage = 4096;
// Runs this small are copied: a mapping costs a VMA and ~5 us.
constexpr uint64_t kMapMinBytes = 64 << 10;

// The task's state: registers, signal handlers and mask, rseq, the alternate
// stack; refused for what the fast path does not restore (timers, pending
// signals, 32-bit or stopped tasks).
absl::Status PlanTask(const std::string& dir, const std::string& p,
                      std::vector<Image>* keep, PlanHeader* h,
                      std::vector<PlanSigaction>* sigacts) {
  auto core = ReadOne(dir, "core-" + p + ".img", keep);
  if (!core.ok()) return core.status();
  if (core->U(1) != 1) return Refuse("not x86-64");
  auto ti = core->Sub(2), tc = core->Sub(3), th = core->Sub(5);
  if (!ti.ok() || !tc.ok() || !th.ok())
    return absl::DataLossError("core image lacks thread state");
  auto gp = ti->Sub(2), fp = ti->Sub(3);
  if (!gp.ok() || !fp.ok()) return absl::DataLossError("core lacks registers");
  if (gp->U(28, 1) != 1) return Refuse("32-bit task");
  if (tc->U(1) != 1) return Refuse("task is not running");
  if (tc->Has(7)) {
    auto timers = tc->Sub(7);
    if (!timers.ok()) return timers.status();
    if (!timers->Bs(4).empty()) return Refuse("POSIX timers");
    for (uint32_t f : {1u, 2u, 3u}) {
      auto it = timers->Sub(f);
      if (it.ok() && (it->U(1) || it->U(2) || it->U(3) || it->U(4)))
        return Refuse("interval timers");
    }
  }
  for (const Msg* m : {&*tc, &*th}) {
    uint32_t f = m == &*tc ? 10 : 9;
    if (!m->Has(f)) continue;
    auto q = m->Sub(f);
    if (q.ok() && !q->Bs(1).empty()) return Refuse("pending signals");
  }

  const uint32_t order[18] = {10, 9, 8, 7,  4,  3,  2,  1,  15,
                              14, 5, 6, 13, 11, 12, 20, 17, 19};
  for (int i = 0; i < 18; ++i) h->gpr[i] = gp->U(order[i]);
  h->cs = gp->U(18);
  h->ss = gp->U(21);
  h->fs_base = gp->U(22);
  h->gs_base = gp->U(23);
  uint16_t w16[4] = {
      static_cast<uint16_t>(fp->U(1)), static_cast<uint16_t>(fp->U(2)),
      static_cast<uint16_t>(fp->U(3)), static_cast<uint16_t>(fp->U(4))};
  memcpy(h->fxsave, w16, 8);
  uint64_t rip = fp->U(5), rdp = fp->U(6);
  memcpy(h->fxsave + 8, &rip, 8);
  memcpy(h->fxsave + 16, &rdp, 8);
  uint32_t mx[2] = {static_cast<uint32_t>(fp->U(7)),
                    static_cast<uint32_t>(fp->U(8))};
  memcpy(h->fxsave + 24, mx, 8);
  auto st = fp->Us(9), xmm = fp->Us(10);
  if (st.size() != 32 || xmm.size() != 64)
    return absl::DataLossError("core image has a short FPU state");
  for (int i = 0; i < 32; ++i) {
    uint32_t v = static_cast<uint32_t>(st[i]);
    memcpy(h->fxsave + 32 + 4 * i, &v, 4);
  }
  for (int i = 0; i < 64; ++i) {
    uint32_t v = static_cast<uint32_t>(xmm[i]);
    memcpy(h->fxsave + 160 + 4 * i, &v, 4);
  }
  h->blocked = th->Has(6) ? th->U(6) : tc->U(5);
  h->clear_tid = ti->U(1);
  h->robust_list = th->U(1);
  h->robust_len = th->U(2);
  if (th->Has(15)) {
    auto rs = th->Sub(15);
    if (!rs.ok()) return rs.status();
    h->rseq = rs->U(1);
    h->rseq_len = rs->U(2);
    h->rseq_sig = rs->U(3);
    if (rs->U(4)) return Refuse("inside an rseq critical section");
  }
  h->sas_flags = 2;  // SS_DISABLE
  if (th->Has(7)) {
    auto sas = th->Sub(7);
    if (!sas.ok()) return sas.status();
    h->sas_sp = sas->U(1);
    h->sas_size = sas->U(2);
    h->sas_flags = sas->U(3);
  }
  auto sas = tc->Bs(15);
  for (size_t i = 0; i < sas.size(); ++i) {
    auto sa = Msg::Parse(sas[i]);
    if (!sa.ok()) return sa.status();
    uint64_t signo = i + 1;
    if (signo == 9 || signo == 19 || sa->U(1) == 0) continue;  // SIG_DFL
    if (sa->U(5)) return Refuse("compat sigaction");
    sigacts->push_back({signo, sa->U(1), sa->U(2), sa->U(3), sa->U(4)});
  }
  return absl::OkStatus();
}

// The regular files the task knows, by id: path and size.
using RegularFiles = std::map<uint64_t, std::pair<std::string, uint64_t>>;

// Its files: only /dev/null may be open, on 0, 1, 2; the root is "/", the
// working directory goes into `h`.
absl::StatusOr<RegularFiles> PlanFiles(const std::string& dir,
                                       const std::string& p,
                                       std::vector<Image>* keep,
                                       PlanHeader* h) {
  auto ids = ReadOne(dir, "ids-" + p + ".img", keep);
  if (!ids.ok()) return ids.status();
  auto files = ReadImage(dir, "files.img");
  if (!files.ok()) return files.status();
  RegularFiles reg;
  for (auto e : files->entries) {
    auto fe = Msg::Parse(e);
    if (!fe.ok()) return fe.status();
    if (fe->U(1) != 1) continue;  // REG
    auto r = fe->Sub(3);
    if (!r.ok()) return r.status();
    reg[fe->U(2)] = {std::string(r->B(6)), r->U(8)};
  }
  auto fdinfo = ReadImage(dir, "fdinfo-" + std::to_string(ids->U(2)) + ".img");
  if (!fdinfo.ok()) return fdinfo.status();
  for (auto e : fdinfo->entries) {
    auto fd = Msg::Parse(e);
    if (!fd.ok()) return fd.status();
    auto it = reg.find(fd->U(1));
    if (fd->U(4) > 2 || it == reg.end() || it->second.first != "/dev/null")
      return Refuse("open files");
  }
  auto fs = ReadOne(dir, "fs-" + p + ".img", keep);
  if (!fs.ok()) return fs.status();
  auto cwd = reg.find(fs->U(1)), root = reg.find(fs->U(2));
  if (cwd == reg.end() || root == reg.end() || root->second.first != "/" ||
      cwd->second.first.size() >= sizeof(h->cwd))
    return Refuse("unusual root or working directory");
  memcpy(h->cwd, cwd->second.first.data(), cwd->second.first.size());
  return reg;
}

// The memory layout: mm's fields into `h`, and the mappings (private
// anonymous or private file mappings only; the vDSO and vvar are noted, the
// live ones are used).
absl::Status PlanMappings(const std::string& dir, const std::string& p,
                          std::vector<Image>* keep, const RegularFiles& reg,
                          PlanHeader* h, std::vector<PlanVma>* vmas,
                          std::vector<PlanFile>* plan_files, FastPlan* plan) {
  auto mm = ReadOne(dir, "mm-" + p + ".img", keep);
  if (!mm.ok()) return mm.status();
  if (!mm->Bs(16).empty()) return Refuse("AIO rings");
  h->start_code = mm->U(1);
  h->end_code = mm->U(2);
  h->start_data = mm->U(3);
  h->end_data = mm->U(4);
  h->start_stack = mm->U(5);
  h->start_brk = mm->U(6);
  h->brk = mm->U(7);
  h->arg_start = mm->U(8);
  h->arg_end = mm->U(9);
  h->env_start = mm->U(10);
  h->env_end = mm->U(11);
  auto auxv = mm->Us(13);
  if (auxv.size() > 64) return Refuse("long auxv");
  h->auxv_n = static_cast<uint32_t>(auxv.size());
  for (size_t i = 0; i < auxv.size(); ++i) h->auxv[i] = auxv[i];

  std::map<uint64_t, int32_t> file_index;
  for (auto e : mm->Bs(14)) {
    auto v = Msg::Parse(e);
    if (!v.ok()) return v.status();
    uint64_t start = v->U(1), end = v->U(2);
    uint32_t status = static_cast<uint32_t>(v->U(7));
    if (start < kRestorerLimit && end > kRestorerBase)
      return Refuse("a mapping where silt-restorer lives");
    if (status & kAreaVsyscall) continue;
    if (status & kAreaVdso) {
      h->vdso_start = start;
      h->vdso_end = end;
      continue;
    }
    if (status & kAreaVvar) {
      h->vvar_start = start;
      h->vvar_end = end;
      continue;
    }
    if ((status & (kUnusual | kFileShared | kAnonShared)) ||
        !(status & kAreaRegular))
      return Refuse(absl::StrCat("mapping kind ", absl::Hex(status)));
    PlanVma pv{};
    pv.start = start;
    pv.end = end;
    pv.pgoff = v->U(3);
    pv.prot = static_cast<uint32_t>(v->U(5));
    pv.flags = static_cast<uint32_t>(v->U(6)) &
               (MAP_PRIVATE | MAP_ANONYMOUS | MAP_GROWSDOWN | MAP_NORESERVE);
    pv.file = -1;
    if (status & kFilePrivate) {
      auto it = reg.find(v->U(4));
      if (it == reg.end()) return absl::DataLossError("mapped file not found");
      auto [fi, added] = file_index.try_emplace(
          v->U(4), static_cast<int32_t>(plan_files->size()));
      if (added) {
        PlanFile f{};
        if (it->second.first.size() >= sizeof(f.path))
          return Refuse("long path");
        memcpy(f.path, it->second.first.data(), it->second.first.size());
        f.size = it->second.second;
        plan_files->push_back(f);
        plan->mapped_files.push_back(it->second.first);
      }
      pv.file = fi->second;
      pv.flags &= ~MAP_ANONYMOUS;
    } else if (!(status & kAnonPrivate)) {
      return Refuse(absl::StrCat("mapping kind ", absl::Hex(status)));
    }
    vmas->push_back(pv);
  }
  return absl::OkStatus();
}

// The pages: each present pagemap entry's pages follow in pages-N.img, as
// runs within one mapping each; small runs (and those of stacks) are copied,
// the rest mapped.
absl::StatusOr<std::vector<PlanRun>> PlanPages(const std::string& dir,
                                               const std::string& p,
                                               const PlanHeader& h,
                                               std::vector<PlanVma>* plan_vmas,
                                               FastPlan* plan) {
  std::vector<PlanVma>& vmas = *plan_vmas;
  auto pagemap = ReadImage(dir, "pagemap-" + p + ".img");
  if (!pagemap.ok()) return pagemap.status();
  if (pagemap->entries.empty()) return absl::DataLossError("empty pagemap");
  auto head = Msg::Parse(pagemap->entries[0]);
  if (!head.ok()) return head.status();
  plan->pages_file = absl::StrCat(dir, "/pages-", head->U(1), ".img");
  std::vector<PlanRun> runs;
  uint64_t offset = 0;
  size_t vi = 0;
  for (size_t i = 1; i < pagemap->entries.size(); ++i) {
    auto pm = Msg::Parse(pagemap->entries[i]);
    if (!pm.ok()) return pm.status();
    uint64_t flags = pm->U(4, kPresent);
    if (pm->U(3) || (flags & kInParent)) return Refuse("incremental image");
    if (!(flags & kPresent)) continue;
    uint64_t addr = pm->U(1), len = pm->U(2) * kPage;
    // CRIU always dumps the vDSO; the restorer moves the live one instead.
    if ((addr >= h.vdso_start && addr < h.vdso_end) ||
        (addr >= h.vvar_start && addr < h.vvar_end)) {
      offset += len;
      continue;
    }
    // Entries come in address order; one may span adjacent mappings.
    while (len > 0) {
      while (vi < vmas.size() && vmas[vi].end <= addr) ++vi;
      if (vi == vmas.size() || addr < vmas[vi].start)
        return Refuse(
            absl::StrCat("pages outside the mappings at 0x", absl::Hex(addr)));
      uint64_t chunk = std::min(len, vmas[vi].end - addr);
      if (!runs.empty() && runs.back().vma == vi &&
          runs.back().start + runs.back().len == addr &&
          runs.back().offset + runs.back().len == offset) {
        runs.back().len += chunk;
      } else {
        runs.push_back({addr, chunk, offset, static_cast<uint32_t>(vi), 0});
      }
      addr += chunk;
      offset += chunk;
      len -= chunk;
    }
  }
  for (auto& r : runs) {
    r.map = r.len >= kMapMinBytes && !(vmas[r.vma].flags & MAP_GROWSDOWN);
    if (!r.map) vmas[r.vma].copy = 1;
  }
  return runs;
}

}  // namespace

absl::StatusOr<FastPlan> BuildRestorePlan(const std::string& dir) {
  // One process, one thread.
  auto pstree = ReadImage(dir, "pstree.img");
  if (!pstree.ok()) return pstree.status();
  if (pstree->entries.size() != 1) return Refuse("several processes");
  auto pe = Msg::Parse(pstree->entries[0]);
  if (!pe.ok()) return pe.status();
  if (pe->Us(5).size() != 1) return Refuse("several threads");
  const std::string p = std::to_string(pe->U(1));
  std::vector<Image> keep;

  PlanHeader h;
  memset(&h, 0, sizeof(h));
  h.magic = kPlanMagic;
  std::vector<PlanSigaction> sigacts;
  if (auto s = PlanTask(dir, p, &keep, &h, &sigacts); !s.ok()) return s;
  auto reg = PlanFiles(dir, p, &keep, &h);
  if (!reg.ok()) return reg.status();
  FastPlan plan;
  std::vector<PlanVma> vmas;
  std::vector<PlanFile> plan_files;
  if (auto s = PlanMappings(dir, p, &keep, *reg, &h, &vmas, &plan_files, &plan);
      !s.ok())
    return s;
  auto planned_runs = PlanPages(dir, p, h, &vmas, &plan);
  if (!planned_runs.ok()) return planned_runs.status();
  const std::vector<PlanRun>& runs = *planned_runs;

  std::string out(sizeof(PlanHeader), '\0');
  h.n_vmas = static_cast<uint32_t>(vmas.size());
  h.n_runs = static_cast<uint32_t>(runs.size());
  h.n_files = static_cast<uint32_t>(plan_files.size());
  h.n_sigacts = static_cast<uint32_t>(sigacts.size());
  memcpy(out.data(), &h, sizeof(h));
  auto append = [&](const void* p, size_t n) {
    out.append(static_cast<const char*>(p), n);
  };
  append(vmas.data(), vmas.size() * sizeof(PlanVma));
  append(runs.data(), runs.size() * sizeof(PlanRun));
  append(plan_files.data(), plan_files.size() * sizeof(PlanFile));
  append(sigacts.data(), sigacts.size() * sizeof(PlanSigaction));
  if (out.size() > kPlanMaxBytes) return Refuse("too many mappings");
  plan.bytes = std::move(out);
  return plan;
}

}  // namespace silt::snapshot
