#include "common/contract/flight_recorder.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ddp::flight {
namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

std::string Bytes(uint64_t n) {
  if (n >= (1ull << 30)) return absl::StrFormat("%.1f GB", static_cast<double>(n) / 1e9);
  if (n >= (1ull << 20)) return absl::StrFormat("%.1f MB", static_cast<double>(n) / 1e6);
  if (n >= 1000) return absl::StrFormat("%.1f kB", static_cast<double>(n) / 1e3);
  return absl::StrCat(n, " B");
}

// The entries of `layout` in sequence order, each read consistently (its seq word the
// same before and after).
void ReadEntries(const Layout& layout, uint64_t entered, std::vector<Collective>* out) {
  const uint64_t first = entered > kCapacity ? entered - kCapacity + 1 : 1;
  for (uint64_t s = first; s <= entered; ++s) {
    const Entry& e = layout.entries[s % kCapacity];
    const uint64_t before = e.seq.load(std::memory_order_acquire);
    if (before != s) continue;  // Being rewritten, or overtaken.
    Collective c;
    c.seq = s;
    c.kind = static_cast<Kind>(e.kind.load(kRelaxed));
    c.bucket = e.bucket.load(kRelaxed);
    c.bytes = e.bytes.load(kRelaxed);
    c.start_ns = e.start_ns.load(kRelaxed);
    c.end_ns = e.end_ns.load(std::memory_order_acquire);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (e.seq.load(kRelaxed) != s) continue;
    out->push_back(c);
  }
}

Snapshot ReadLayout(const Layout& layout) {
  Snapshot s;
  s.pid = layout.pid.load(kRelaxed);
  s.rank = layout.rank.load(kRelaxed);
  const uint32_t phase = layout.phase.load(kRelaxed);
  s.phase = phase < kPhaseCount ? static_cast<Phase>(phase) : Phase::kStarting;
  s.phase_since_ns = layout.phase_since_ns.load(kRelaxed);
  s.global_step = layout.global_step.load(kRelaxed);
  s.entered = layout.entered.load(std::memory_order_acquire);
  s.completed = layout.completed.load(std::memory_order_acquire);
  ReadEntries(layout, s.entered, &s.recent);
  return s;
}

}  // namespace

const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kStarting: return "its start-up";
    case Phase::kData: return "data loading";
    case Phase::kCompute: return "forward and backward";
    case Phase::kCommWait: return "a communication wait";
    case Phase::kOptimizer: return "the optimizer step";
    case Phase::kCheckpoint: return "a checkpoint";
    case Phase::kEvaluate: return "evaluation";
    case Phase::kProgram: return "its own code, outside ddp's calls";
    case Phase::kRecovery: return "a live recovery";
    case Phase::kDone: return "its end";
  }
  return "an unknown phase";
}

const char* PhaseLabel(Phase phase) {
  switch (phase) {
    case Phase::kStarting: return "starting";
    case Phase::kData: return "data";
    case Phase::kCompute: return "compute";
    case Phase::kCommWait: return "comm_wait";
    case Phase::kOptimizer: return "optimizer";
    case Phase::kCheckpoint: return "checkpoint";
    case Phase::kEvaluate: return "evaluate";
    case Phase::kProgram: return "program";
    case Phase::kRecovery: return "recovery";
    case Phase::kDone: return "done";
  }
  return "unknown";
}

std::string PhaseNameOfLabel(const std::string& label) {
  for (uint32_t p = 0; p < kPhaseCount; ++p) {
    if (label == PhaseLabel(static_cast<Phase>(p))) return PhaseName(static_cast<Phase>(p));
  }
  return absl::StrCat("an unknown phase (", label, ")");
}

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kAllReduce: return "all-reduce";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kAllGather: return "all-gather";
    case Kind::kBarrier: return "barrier";
    case Kind::kReduceScatter: return "reduce-scatter";
    case Kind::kOther: return "collective";
  }
  return "collective";
}

int64_t NowNs() {
  struct timespec ts;
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string Describe(const Collective& c) {
  std::string out = absl::StrCat(KindName(c.kind), " #", c.seq);
  if (c.bucket >= 0) {
    absl::StrAppend(&out, " (bucket ", c.bucket, ", ", Bytes(c.bytes), ")");
  } else if (c.bytes > 0) {
    absl::StrAppend(&out, " (", Bytes(c.bytes), ")");
  }
  return out;
}

const Collective* Snapshot::OldestInFlight() const {
  for (const Collective& c : recent) {
    if (c.seq > completed && c.end_ns == 0) return &c;
  }
  return nullptr;
}

const Collective* Snapshot::Last() const { return recent.empty() ? nullptr : &recent.back(); }

Recorder::Recorder() : layout_(nullptr), owned_(new Layout()) {
  layout_ = owned_.get();
  Init(-1);
}

Recorder::Recorder(Layout* layout, size_t mapped, std::string path)
    : layout_(layout), mapped_(mapped), path_(std::move(path)) {}

absl::StatusOr<std::unique_ptr<Recorder>> Recorder::OpenFile(const std::string& path, int rank) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot open the flight recorder ", path, ": ", std::strerror(errno)));
  }
  const size_t size = sizeof(Layout);
  // Zeroed first: a file of an earlier process (a replaced rank) starts over.
  if (::ftruncate(fd, 0) != 0 || ::ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot size the flight recorder ", path, ": ", std::strerror(err)));
  }
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  ::close(fd);
  if (p == MAP_FAILED) {
    return absl::UnavailableError(
        absl::StrCat("cannot map the flight recorder ", path, ": ", std::strerror(err)));
  }
  std::unique_ptr<Recorder> r(new Recorder(new (p) Layout(), size, path));
  r->Init(rank);
  return r;
}

Recorder::~Recorder() {
  if (mapped_ > 0) ::munmap(layout_, mapped_);
}

void Recorder::Init(int rank) {
  Layout& l = *layout_;
  l.version = kVersion;
  l.capacity = kCapacity;
  l.pid.store(static_cast<int32_t>(::getpid()), kRelaxed);
  l.rank.store(rank, kRelaxed);
  l.phase.store(static_cast<uint32_t>(Phase::kStarting), kRelaxed);
  l.phase_since_ns.store(NowNs(), kRelaxed);
  l.global_step.store(-1, kRelaxed);
  l.entered.store(0, kRelaxed);
  l.completed.store(0, kRelaxed);
  for (Entry& e : l.entries) e.seq.store(0, kRelaxed);
  std::atomic_thread_fence(std::memory_order_release);
  l.magic = kMagic;  // Last: a reader takes the file for a recorder from here on.
}

uint64_t Recorder::Enter(Kind kind, uint64_t bytes, int bucket) {
  Layout& l = *layout_;
  const uint64_t seq = l.entered.load(kRelaxed) + 1;
  Entry& e = l.entries[seq % kCapacity];
  e.seq.store(0, kRelaxed);
  std::atomic_thread_fence(std::memory_order_release);
  e.kind.store(static_cast<uint32_t>(kind), kRelaxed);
  e.bucket.store(bucket, kRelaxed);
  e.bytes.store(bytes, kRelaxed);
  e.start_ns.store(NowNs(), kRelaxed);
  e.end_ns.store(0, kRelaxed);
  e.seq.store(seq, std::memory_order_release);
  l.entered.store(seq, std::memory_order_release);
  return seq;
}

void Recorder::Exit(uint64_t seq) {
  Layout& l = *layout_;
  Entry& e = l.entries[seq % kCapacity];
  if (e.seq.load(kRelaxed) == seq) e.end_ns.store(NowNs(), std::memory_order_release);
  uint64_t done = l.completed.load(kRelaxed);
  while (done < seq && !l.completed.compare_exchange_weak(done, seq, std::memory_order_release)) {
  }
}

Phase Recorder::SetPhase(Phase phase) {
  Layout& l = *layout_;
  const Phase before = static_cast<Phase>(l.phase.load(kRelaxed));
  if (before == phase) return before;
  l.phase_since_ns.store(NowNs(), kRelaxed);
  l.phase.store(static_cast<uint32_t>(phase), std::memory_order_release);
  return before;
}

Phase Recorder::phase() const { return static_cast<Phase>(layout_->phase.load(kRelaxed)); }

void Recorder::SetStep(int64_t global_step) { layout_->global_step.store(global_step, kRelaxed); }

Snapshot Recorder::Read() const { return ReadLayout(*layout_); }

std::string Recorder::Describe(uint64_t seq) const {
  const Snapshot s = Read();
  for (const Collective& c : s.recent) {
    if (c.seq == seq) return flight::Describe(c);
  }
  return absl::StrCat("collective #", seq);
}

absl::StatusOr<Snapshot> ReadFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    const std::string what = absl::StrCat("flight recorder ", path, ": ", std::strerror(err));
    return err == ENOENT ? absl::NotFoundError(what) : absl::UnavailableError(what);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < sizeof(Layout)) {
    ::close(fd);
    return absl::NotFoundError(absl::StrCat("flight recorder ", path, " is not written yet"));
  }
  void* p = ::mmap(nullptr, sizeof(Layout), PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) {
    return absl::UnavailableError(absl::StrCat("cannot map flight recorder ", path));
  }
  const Layout& l = *static_cast<const Layout*>(p);
  absl::StatusOr<Snapshot> out;
  if (l.magic != kMagic || l.version != kVersion || l.capacity != kCapacity) {
    out = absl::DataLossError(absl::StrCat(path, " is not a ddp flight recorder (version ",
                                           kVersion, ")"));
  } else {
    out = ReadLayout(l);
  }
  ::munmap(p, sizeof(Layout));
  return out;
}

}  // namespace ddp::flight
