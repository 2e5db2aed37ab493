// Snapshot images on this node: checkpoints, the catalog, integrity, peer
// fetch, and the working sets lazy restores record.
#include "invoker_impl.h"

namespace silt::invoker {

std::vector<snapshot::ExternalMount> Invoker::Impl::Mounts(
    const Instance& inst, const Bundle& bundle) {
  std::vector<snapshot::ExternalMount> m = {
      {kSandboxBundleDir, "bundle", bundle.dir},
      {kSandboxSecretsDir, "secrets", inst.base_dir + "/secrets"},
      {kSandboxWorkerDir, "bin", worker_dir},
      {kSandboxRunDir, "run", inst.base_dir + "/run"}};
  if (bind_dev_tmp) {
    m.push_back({"/dev", "dev", dev_dir});
    m.push_back({"/tmp", "tmp", inst.base_dir + "/tmp"});
  }
  return m;
}

void Invoker::Impl::DropImage(const std::string& id, const std::string& why) {
  std::vector<std::shared_ptr<Template>> templates;
  {
    std::lock_guard<std::mutex> l(mu);
    images->Forget(id);
    // Staged restorers and templates map this image's pages: they go too
    // (clones keep their template until they end), and the next cold
    // start boots and snapshots again. So do staged containers restored
    // from it (a damaged or replaced checkpoint).
    for (auto& [key, pool] : pools) {
      if (pool->snapshot_id != id) continue;
      if (pool->restorer) graveyard.push_back(std::move(pool->restorer));
      if (pool->staged) graveyard.push_back(std::move(pool->staged));
      if (pool->tmpl) {
        templates.push_back(std::move(pool->tmpl));
        pool->template_retry_after = Clock::now() + std::chrono::seconds(5);
      }
    }
  }
  templates.clear();
  std::string dir = images->Dir(id);
  std::string trash = images->Aside("trash", id);
  std::error_code ec;
  if (std::filesystem::exists(dir, ec)) {
    std::filesystem::rename(dir, trash, ec);
    std::filesystem::remove_all(ec ? dir : trash, ec);
  }
  if (!why.empty())
    fprintf(stderr, "silt-invoker: dropped snapshot %s: %s\n", id.c_str(),
            why.c_str());
}

absl::Status Invoker::Impl::WakeAndResume(const FunctionSpec& spec,
                                          Instance& inst, pid_t pid,
                                          int listener, bool as_template) {
  kill(pid, SIGUSR1);
  pollfd p{listener, POLLIN, 0};
  int r = 0;
  for (int waited = 0; r != 1 && waited < 10000; waited += 20) {
    r = poll(&p, 1, 20);
    if (r < 0 && errno != EINTR) break;
    if (r != 1 && !Alive(pid)) break;
  }
  if (r != 1)
    return absl::UnavailableError(
        absl::StrCat("instance ", inst.id, " did not reconnect after restore (",
                     Alive(pid) ? "timed out" : "it died", ")"));
  int chan = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
  if (chan < 0) return absl::InternalError("accept failed");
  if (inst.channel >= 0) close(inst.channel);
  inst.channel = chan;
  int out_w, err_w;
  if (auto s = LogPipes(spec, inst.id, &out_w, &err_w); !s.ok()) return s;
  auto state = StateSocket(spec);
  if (!state.ok()) {
    close(out_w);
    close(err_w);
    return state.status();
  }
  int fds[3] = {out_w, err_w, *state};
  absl::Status s = SendFds(chan, fds, 3);
  close(out_w);
  close(err_w);
  close(*state);
  if (!s.ok()) return s;
  v1::WorkerCall resume;
  resume.set_op(v1::WORKER_OP_RESUME);
  resume.set_instance_id(inst.id);
  resume.set_seed(Seed());
  resume.set_as_template(as_template);
  if (auto w = WriteFrame(chan, resume); !w.ok()) return w;
  v1::WorkerReady ready;
  if (auto rd = ReadFrame(chan, &ready, std::chrono::seconds(30)); !rd.ok())
    return absl::UnavailableError(
        absl::StrCat("instance ", inst.id, " did not resume: ", rd.message()));
  if (!ready.ok())
    return absl::FailedPreconditionError(
        absl::StrCat("instance ", inst.id, " failed to resume"));
  TakeReady(inst, ready);
  return absl::OkStatus();
}

bool Invoker::Impl::Alive(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  std::getline(in, stat);
  size_t paren = stat.rfind(')');
  return paren != std::string::npos && paren + 2 < stat.size() &&
         stat[paren + 2] != 'Z' && stat[paren + 2] != 'X';
}

uint64_t Invoker::Impl::Seed() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

absl::Status Invoker::Impl::Checkpoint(Pool& pool, Instance& inst) {
  auto start = Clock::now();
  v1::WorkerCall park;
  park.set_op(v1::WORKER_OP_PARK);
  v1::WorkerReply ok;
  if (auto s = WriteFrame(inst.channel, park); !s.ok()) return s;
  if (auto s = ReadFrame(inst.channel, &ok, std::chrono::seconds(10)); !s.ok())
    return s;
  // It closes the channel once its stdio points at /dev/null: then nothing
  // of ours is open in it.
  v1::WorkerReply none;
  auto closed = ReadFrame(inst.channel, &none, std::chrono::seconds(10));
  if (!absl::IsUnavailable(closed))
    return absl::InternalError("the worker did not park");
  close(inst.channel);
  inst.channel = -1;

  const std::string& id = pool.snapshot_id;
  std::string tmp = images->Aside("tmp", id);
  std::error_code ec;
  std::filesystem::create_directories(tmp, ec);
  auto listener = ListenIn(inst.base_dir + "/run", inst.host_id);
  if (!listener.ok()) return listener.status();
  snapshot::DumpOptions d;
  d.pid = inst.proc->pid();
  d.images_dir = tmp;
  d.mounts = Mounts(inst, *pool.bundle);
  d.leave_running = true;
  absl::Status dumped = snapshot::Dump(d);
  double dump_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (dumped.ok()) {
    snapshot::Manifest m;
    m.id = id;
    m.function = pool.spec.name();
    m.ns = pool.spec.namespace_();
    m.generation = pool.spec.generation();
    m.bundle_digest = pool.spec.bundle_digest();
    m.kind = pool.bundle->manifest.kind;
    m.kernel = snapshot::KernelRelease();
    m.criu_version = criu_version;
    m.created_unix = WallNanos() / 1000000000;
    m.checkpoint_ms = dump_ms;
    unlink((tmp + "/dump.log").c_str());
    dumped = snapshot::Seal(tmp, images->Dir(id), &m);
    if (dumped.ok()) images->Add(m);
  }
  if (!dumped.ok()) std::filesystem::remove_all(tmp, ec);
  // Running on either way.
  absl::Status resumed =
      WakeAndResume(pool.spec, inst, inst.proc->pid(), *listener);
  close(*listener);
  if (!resumed.ok()) return resumed;
  return dumped;
}

absl::StatusOr<std::string> Invoker::Impl::EnsureImage(Pool& pool) {
  const std::string& id = pool.snapshot_id;
  if (images->Has(id)) return images->Dir(id);
  auto lock = images->FetchLock(id);
  absl::MutexLock fetch_lock(lock.get());
  if (images->Has(id)) return images->Dir(id);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  control::FindSnapshotRequest req;
  req.set_id(id);
  control::FindSnapshotResponse peers;
  grpc::Status st = control->FindSnapshot(&ctx, req, &peers);
  if (!st.ok())
    return absl::UnavailableError(absl::StrCat(
        "cannot ask the gateway for snapshot ", id, ": ", st.error_message()));
  absl::Status last =
      absl::NotFoundError(absl::StrCat("no node holds snapshot ", id));
  for (const auto& addr : peers.addresses()) {
    if (addr == address) continue;
    last = FetchImage(addr, id);
    if (last.ok()) return images->Dir(id);
    fprintf(stderr, "silt-invoker: fetching snapshot %s from %s: %s\n",
            id.c_str(), addr.c_str(), std::string(last.message()).c_str());
  }
  return last;
}

absl::Status Invoker::Impl::FetchImage(const std::string& peer,
                                       const std::string& id) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel =
      grpc::CreateCustomChannel(peer, grpc::InsecureChannelCredentials(), args);
  auto stub = v1::Invoker::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(2));
  v1::FetchSnapshotRequest req;
  req.set_id(id);
  auto reader = stub->FetchSnapshot(&ctx, req);
  std::string tmp = images->Aside("tmp", id);
  std::error_code ec;
  std::filesystem::create_directories(tmp, ec);
  v1::SnapshotChunk chunk;
  int fd = -1;
  std::string current;
  bool have_manifest = false;
  absl::Status status = absl::OkStatus();
  while (reader->Read(&chunk)) {
    if (!chunk.manifest().empty()) {
      std::ofstream(tmp + "/" + snapshot::kManifestName, std::ios::binary)
          << chunk.manifest();
      have_manifest = true;
      continue;
    }
    const std::string& name = chunk.file();
    if (name.empty() || name.find('/') != std::string::npos ||
        name == snapshot::kManifestName || name[0] == '.') {
      status = absl::DataLossError("peer sent a bad file name");
      break;
    }
    if (name != current) {
      if (fd >= 0) close(fd);
      fd = open((tmp + "/" + name).c_str(),
                O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
      current = name;
      if (fd < 0) {
        status = absl::InternalError("cannot write a fetched image file");
        break;
      }
    }
    const std::string& data = chunk.data();
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = write(fd, data.data() + off, data.size() - off);
      if (n <= 0) break;
      off += static_cast<size_t>(n);
    }
  }
  if (fd >= 0) close(fd);
  if (!status.ok()) ctx.TryCancel();
  grpc::Status st = reader->Finish();
  if (status.ok() && !st.ok())
    status = absl::UnavailableError(st.error_message());
  if (status.ok() && !have_manifest)
    status = absl::DataLossError("peer sent no manifest");
  absl::StatusOr<snapshot::Manifest> m =
      status.ok() ? snapshot::Verify(tmp, /*full=*/true)
                  : absl::StatusOr<snapshot::Manifest>(status);
  if (m.ok() && m->id != id)
    m = absl::DataLossError("peer sent another snapshot");
  if (m.ok()) {
    // Exactly the manifest's files.
    for (const auto& e : std::filesystem::directory_iterator(tmp, ec)) {
      std::string n = e.path().filename().string();
      bool listed = n == snapshot::kManifestName;
      for (const auto& f : m->files) listed = listed || f.name == n;
      if (!listed) std::filesystem::remove_all(e.path(), ec);
    }
    if (rename(tmp.c_str(), images->Dir(id).c_str()) != 0)
      m = absl::InternalError("cannot move the fetched snapshot in place");
  }
  if (!m.ok()) {
    std::filesystem::remove_all(tmp, ec);
    return m.status();
  }
  images->Add(*m);
  return absl::OkStatus();
}

grpc::Status Invoker::Impl::FetchSnapshot(
    grpc::ServerContext* ctx, const v1::FetchSnapshotRequest* req,
    grpc::ServerWriter<v1::SnapshotChunk>* writer) {
  if (!images->Has(req->id()))
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no such snapshot here");
  std::string dir = images->Dir(req->id());
  auto m = snapshot::Verify(dir);
  if (!m.ok()) {
    DropImage(req->id(), std::string(m.status().message()));
    return ToGrpc(m.status());
  }
  std::ifstream in(dir + "/" + snapshot::kManifestName, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  v1::SnapshotChunk c;
  c.set_manifest(ss.str());
  if (!writer->Write(c)) return grpc::Status::CANCELLED;
  std::vector<char> buf(1 << 20);
  for (const auto& f : m->files) {
    int fd = open((dir + "/" + f.name).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      return grpc::Status(grpc::StatusCode::DATA_LOSS, "image file vanished");
    bool sent_any = false;
    ssize_t n;
    while ((n = read(fd, buf.data(), buf.size())) > 0 || !sent_any) {
      v1::SnapshotChunk d;
      d.set_file(f.name);
      if (n > 0) d.set_data(buf.data(), static_cast<size_t>(n));
      sent_any = true;
      if (ctx->IsCancelled() || !writer->Write(d)) {
        close(fd);
        return grpc::Status::CANCELLED;
      }
      if (n <= 0) break;
    }
    close(fd);
  }
  return grpc::Status::OK;
}

absl::StatusOr<std::unique_ptr<Instance>> Invoker::Impl::RestoreInstance(
    Pool& pool, bool by_criu, bool as_template) {
  // Checked before every restore (checksums once per file version): a
  // damaged image is dropped, never restored.
  const std::string& id = pool.snapshot_id;
  if (auto m = snapshot::Verify(images->Dir(id)); !m.ok()) {
    logs.Append(Key(pool.spec.namespace_(), pool.spec.name()), "invoker",
                absl::StrCat("silt: not restoring: ", m.status().message()));
    DropImage(id, std::string(m.status().message()));
    return m.status();
  }
  if (!by_criu && fast_restore_on) {
    auto inst = FastRestore(pool, as_template);
    if (inst.ok()) return inst;
    // Unimplemented: an image the restorer does not take (not a failure).
    if (!absl::IsUnimplemented(inst.status())) {
      fprintf(stderr,
              "silt-invoker: fast restore of %s failed (%s); restoring "
              "with CRIU\n",
              id.c_str(), std::string(inst.status().message()).c_str());
      logs.Append(
          Key(pool.spec.namespace_(), pool.spec.name()), "invoker",
          absl::StrCat("silt: fast restore failed (", inst.status().message(),
                       "); restoring with CRIU"));
    }
  }
  return CriuRestoreInstance(pool, by_criu, as_template);
}

bool Invoker::Impl::PrefetchWorkingSet(const Pool& pool,
                                       const snapshot::FastPlan& plan) {
  auto ws = images->WorkingSet(pool.snapshot_id);
  struct Read {
    int fd;
    std::vector<snapshot::FileRange> ranges;
  };
  std::vector<Read> reads;
  auto add = [&reads](const std::string& path,
                      std::vector<snapshot::FileRange> want) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st;
    if (want.empty() && fstat(fd, &st) == 0 && st.st_size > 0)
      want.push_back({0, static_cast<uint64_t>(st.st_size)});
    // In the page cache already (started lately): nothing to read.
    auto uncached = snapshot::Uncached(fd, want);
    if (uncached.empty()) {
      close(fd);
      return;
    }
    reads.push_back({fd, std::move(uncached)});
  };
  add(plan.pages_file,
      ws != nullptr ? *ws : std::vector<snapshot::FileRange>{});
  const std::string bundle_prefix = std::string(kSandboxBundleDir) + "/";
  for (const auto& f : plan.mapped_files)
    if (absl::StartsWith(f, bundle_prefix))
      add(pool.bundle->dir + "/" + f.substr(bundle_prefix.size()), {});
  if (!reads.empty()) {
    try {
      // Holds only its own fds and ranges: nothing of the invoker's.
      std::thread([reads = std::move(reads)] {
        for (const auto& r : reads) {
          snapshot::Prefetch(r.fd, r.ranges);
          close(r.fd);
        }
      }).detach();
    } catch (const std::system_error&) {
      for (const auto& r : reads) close(r.fd);
    }
  }
  return ws != nullptr;
}

void Invoker::Impl::RecordWorkingSet(const std::string& id, pid_t pid) {
  if (images->WorkingSet(id) != nullptr) return;
  auto plan = images->Plan(id);
  if (!plan.ok()) return;
  auto ranges = snapshot::TouchedRanges(pid, (*plan)->pages_file);
  if (!ranges.ok() || ranges->empty()) return;
  images->SaveWorkingSet(id, *std::move(ranges)).IgnoreError();
}

void Invoker::Impl::CollectImages(const std::set<std::string>& wanted_ids) {
  for (const auto& m : images->List())
    if (!wanted_ids.contains(m.id)) DropImage(m.id, "");
  // Container functions' start times too (their checkpoints are images).
  absl::MutexLock l(&container_times_mu);
  std::erase_if(container_times,
                [&](const auto& e) { return !wanted_ids.contains(e.first); });
}

}  // namespace silt::invoker
