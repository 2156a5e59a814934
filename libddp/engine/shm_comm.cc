#include "libddp/engine/shm_comm.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <new>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace ddp {
namespace {

constexpr uint64_t kMagic = 0x316d68732d706464ULL;  // "ddp-shm1"
constexpr size_t kPage = 4096;
constexpr size_t kAlign = 64;  // Parts of a chunk start on their own cache line.
constexpr char kErrorPrefix[] = "error:";

enum Word { kDeposited = 0, kReduced = 1, kFinished = 2 };

// Per local rank: the last round it deposited, reduced and finished (copied out).
struct alignas(64) RankWords {
  std::atomic<uint64_t> words[3];
};

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

std::string SegmentName(const ShmNodeComm::Options& o) {
  std::string job;
  for (char c : o.job_id.substr(0, 100)) {
    job.push_back(absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'
                      ? c
                      : '_');
  }
  // The pid and a random tag keep two groups apart even when they share a job id
  // (ranks started by hand all default to "local", attempt 0).
  std::random_device random;
  return absl::StrFormat("/ddp.%s.a%d.n%d.%d.%08x", job, o.attempt, o.group_rank,
                         static_cast<int>(::getpid()), random());
}

std::string SegmentKey(int group) { return absl::StrCat("shm/node", group, "/segment"); }
std::string MappedKey(int group, int local) {
  return absl::StrCat("shm/node", group, "/mapped/", local);
}

template <typename T>
void AddInto(T* __restrict acc, const T* __restrict x, size_t n) {
  for (size_t k = 0; k < n; ++k) acc[k] += x[k];
}

// slot0[lo, hi) = ((slot0 + slot1) + slot2) + ... element by element, in blocks that
// stay in L1 while every slot is added.
template <typename T>
void SumSlots(char* const* slots, int n_slots, size_t lo, size_t hi) {
  constexpr size_t kBlock = 4096;
  T* acc = reinterpret_cast<T*>(slots[0]);
  for (size_t b = lo; b < hi; b += kBlock) {
    const size_t n = std::min(kBlock, hi - b);
    for (int j = 1; j < n_slots; ++j) AddInto(acc + b, reinterpret_cast<const T*>(slots[j]) + b, n);
  }
}

// out[0, n) = ((slot0 + slot1) + slot2) + ..., for a rank that sums a whole chunk.
template <typename T>
void SumSlotsInto(T* __restrict out, char* const* slots, int n_slots, size_t n) {
  constexpr size_t kBlock = 4096;
  for (size_t b = 0; b < n; b += kBlock) {
    const size_t m = std::min(kBlock, n - b);
    const T* __restrict s0 = reinterpret_cast<const T*>(slots[0]) + b;
    const T* __restrict s1 = reinterpret_cast<const T*>(slots[1]) + b;
    T* __restrict o = out + b;
    for (size_t k = 0; k < m; ++k) o[k] = s0[k] + s1[k];
    for (int j = 2; j < n_slots; ++j) AddInto(o, reinterpret_cast<const T*>(slots[j]) + b, m);
  }
}

}  // namespace

struct ShmNodeComm::Header {
  uint64_t magic;
  int32_t local_world;
  int32_t creator_pid;
  uint64_t slot_bytes;
  uint64_t slots_offset;
  FutexWord futex;  // Bumped on every change below.
  alignas(64) std::atomic<uint64_t> result_ready;  // Last round whose slot[0] is final.
  alignas(64) std::atomic<uint32_t> aborted;       // 0; 1 writing the reason; 2 written.
  char abort_reason[512];
  RankWords ranks[kMaxLocalRanks];
  pthread_mutex_t alive[kMaxLocalRanks];  // Robust; each rank holds its own while it lives.
  std::atomic<int32_t> pids[kMaxLocalRanks];  // Set once the rank holds its mutex.
};

absl::StatusOr<std::unique_ptr<ShmNodeComm>> ShmNodeComm::Create(const Options& options,
                                                                 ShmRendezvous& rendezvous) {
  const int local_world = options.local_world;
  if (local_world < 2 || local_world > kMaxLocalRanks || options.local_rank < 0 ||
      options.local_rank >= local_world) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared memory needs 2..", kMaxLocalRanks, " local ranks (LOCAL_WORLD_SIZE ",
        local_world, ", LOCAL_RANK ", options.local_rank, ")"));
  }
  size_t slot_bytes = options.slot_bytes;
  if (slot_bytes == 0) {
    slot_bytes = std::clamp<size_t>((16u << 20) / (2 * local_world), 64u << 10, 4u << 20);
  }
  slot_bytes = RoundUp(slot_bytes, kPage);
  const size_t slots_offset = RoundUp(sizeof(Header), kPage);
  const size_t total = slots_offset + 2 * static_cast<size_t>(local_world) * slot_bytes;
  const std::string segment_key = SegmentKey(options.group_rank);
  const std::string my_key = MappedKey(options.group_rank, options.local_rank);

  if (options.local_rank == 0) {
    absl::StatusOr<ShmSegment> seg = ShmSegment::Create(SegmentName(options), total);
    if (!seg.ok()) {
      (void)rendezvous.Set(segment_key, absl::StrCat(kErrorPrefix, seg.status().message()));
      return seg.status();
    }
    Header* h = new (seg->data()) Header();
    h->magic = kMagic;
    h->local_world = local_world;
    h->creator_pid = static_cast<int32_t>(::getpid());
    h->slot_bytes = slot_bytes;
    h->slots_offset = slots_offset;
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_setpshared(&attr, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&attr, PTHREAD_MUTEX_ROBUST);
    for (int r = 0; r < local_world; ++r) pthread_mutex_init(&h->alive[r], &attr);
    pthread_mutexattr_destroy(&attr);
    pthread_mutex_lock(&h->alive[0]);
    h->pids[0].store(h->creator_pid);
    std::unique_ptr<ShmNodeComm> comm(new ShmNodeComm(options, *std::move(seg), slot_bytes));
    DDP_RETURN_IF_ERROR(rendezvous.Set(segment_key, comm->segment_name()));
    // Every peer says whether it mapped the segment; then the name goes, whatever
    // they said: from here on only the mappings keep the memory.
    absl::Status peers;
    for (int r = 1; r < local_world; ++r) {
      absl::StatusOr<std::string> v = rendezvous.Get(MappedKey(options.group_rank, r));
      if (!v.ok() && peers.ok()) peers = v.status();
      if (v.ok() && absl::StartsWith(*v, kErrorPrefix) && peers.ok()) {
        peers = absl::UnavailableError(absl::StrCat("local rank ", r, " could not map ",
                                                    comm->segment_name(), ": ",
                                                    v->substr(sizeof(kErrorPrefix) - 1)));
      }
    }
    absl::Status unlinked = comm->segment_.Unlink();
    if (!peers.ok()) return peers;
    if (!unlinked.ok()) return unlinked;
    return comm;
  }

  absl::StatusOr<std::string> name = rendezvous.Get(segment_key);
  if (!name.ok()) return name.status();
  if (absl::StartsWith(*name, kErrorPrefix)) {
    return absl::UnavailableError(
        absl::StrCat("local rank 0 could not set up shared memory: ",
                     name->substr(sizeof(kErrorPrefix) - 1)));
  }
  auto report = [&](const absl::Status& st) {
    (void)rendezvous.Set(my_key, absl::StrCat(kErrorPrefix, st.message()));
    return st;
  };
  absl::StatusOr<ShmSegment> seg = ShmSegment::Open(*name);
  if (!seg.ok()) return report(seg.status());
  auto* h = static_cast<Header*>(seg->data());
  if (seg->size() != total || h->magic != kMagic || h->local_world != local_world ||
      h->slot_bytes != slot_bytes) {
    return report(absl::UnavailableError(absl::StrCat(
        "shared memory ", *name, " does not match this rank's layout (", local_world,
        " local ranks, ", slot_bytes, "-byte slots): are LOCAL_WORLD_SIZE and the job the "
        "same on every rank of this node?")));
  }
  int err = pthread_mutex_lock(&h->alive[options.local_rank]);
  if (err != 0) return report(absl::UnavailableError(absl::StrCat(
                    "local rank ", options.local_rank, "'s slot in ", *name, " is taken")));
  h->pids[options.local_rank].store(static_cast<int32_t>(::getpid()));
  std::unique_ptr<ShmNodeComm> comm(new ShmNodeComm(options, *std::move(seg), slot_bytes));
  absl::Status st = rendezvous.Set(my_key, "ok");
  if (!st.ok()) return st;
  return comm;
}

ShmNodeComm::ShmNodeComm(const Options& options, ShmSegment segment, size_t slot_bytes)
    : options_(options),
      segment_(std::move(segment)),
      header_(static_cast<Header*>(segment_.data())),
      slots_(static_cast<char*>(segment_.data()) + header_->slots_offset),
      slot_bytes_(slot_bytes) {}

ShmNodeComm::~ShmNodeComm() {
  // Peers see an unlocked (rather than an owner-died) mutex: this rank is gone.
  pthread_mutex_unlock(&header_->alive[options_.local_rank]);
}

void ShmNodeComm::SetCrossNode(CrossNode* cross) { cross_ = cross; }

char* ShmNodeComm::Slot(uint64_t round, int rank) const {
  const size_t set = round % 2;
  return slots_ + (set * options_.local_world + rank) * slot_bytes_;
}

bool ShmNodeComm::AllAtLeast(int word, uint64_t round) const {
  for (int r = 0; r < options_.local_world; ++r) {
    if (header_->ranks[r].words[word].load(std::memory_order_acquire) < round) return false;
  }
  return true;
}

ShmNodeComm::OpId ShmNodeComm::StartSum(void* data, size_t count, ShmDType dtype) {
  const size_t elem = dtype == ShmDType::kFloat32 ? sizeof(float) : sizeof(double);
  return Start(Kind::kSum, data, count * elem, dtype);
}

ShmNodeComm::OpId ShmNodeComm::StartBroadcast(void* data, size_t bytes) {
  return Start(Kind::kBroadcast, data, bytes, ShmDType::kFloat32);
}

ShmNodeComm::OpId ShmNodeComm::Start(Kind kind, void* data, size_t bytes, ShmDType dtype) {
  absl::MutexLock lock(&mu_);
  const OpId id = next_id_++;
  if (!failed_.ok()) return id;  // Wait() reports the failure.
  if (bytes == 0 && ops_.empty()) {  // Same on every rank: no round at all.
    done_id_ = id;
    return id;
  }
  Op op;
  op.id = id;
  op.kind = kind;
  op.dtype = dtype;
  op.data = static_cast<char*>(data);
  op.bytes = bytes;
  op.deadline = absl::Now() + options_.timeout;
  ops_.push_back(std::move(op));
  return id;
}

void ShmNodeComm::Poll() {
  absl::MutexLock lock(&mu_);
  while (!ops_.empty() && failed_.ok()) {
    absl::StatusOr<bool> done = AdvanceLocked(ops_.front(), /*block=*/false);
    if (!done.ok()) {
      FailLocked(done.status());
    } else if (*done) {
      done_id_ = ops_.front().id;
      ops_.pop_front();
    } else {
      return;
    }
  }
}

absl::Status ShmNodeComm::Wait(OpId id) {
  absl::MutexLock lock(&mu_);
  while (done_id_ < id) {
    if (!failed_.ok()) return failed_;
    if (ops_.empty()) return absl::InternalError(absl::StrCat("no collective ", id, " started"));
    absl::StatusOr<bool> done = AdvanceLocked(ops_.front(), /*block=*/true);
    if (!done.ok()) {
      FailLocked(done.status());
    } else {
      done_id_ = ops_.front().id;
      ops_.pop_front();
    }
  }
  return absl::OkStatus();
}

void ShmNodeComm::FailLocked(const absl::Status& status) {
  failed_ = status;
  ops_.clear();
  Abort(std::string(status.message()));
}

void ShmNodeComm::Abort(const std::string& reason) {
  uint32_t expected = 0;
  if (header_->aborted.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    const std::string text =
        absl::StrCat("local rank ", options_.local_rank, " (pid ", ::getpid(), "): ", reason);
    const size_t n = std::min(text.size(), sizeof(header_->abort_reason) - 1);
    std::memcpy(header_->abort_reason, text.data(), n);
    header_->abort_reason[n] = '\0';
    header_->aborted.store(2, std::memory_order_release);
  }
  Notify(header_->futex);
}

absl::Status ShmNodeComm::AbortedStatus() const {
  const uint32_t state = header_->aborted.load(std::memory_order_acquire);
  if (state == 0) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "the node's shared-memory group was aborted by ",
      state == 2 ? header_->abort_reason : "a peer"));
}

absl::Status ShmNodeComm::Check(const Op& op, const char* what) {
  if (absl::Status st = AbortedStatus(); !st.ok()) return st;
  for (int r = 0; r < options_.local_world; ++r) {
    if (r == options_.local_rank) continue;
    const int err = pthread_mutex_trylock(&header_->alive[r]);
    if (err == EBUSY) continue;  // Held: the peer lives.
    // EOWNERDEAD: it died holding it (the kernel released it); 0: it let go on exit,
    // or has not finished setting up yet (no pid). ENOTRECOVERABLE: another waiter
    // saw it die first.
    if (err == 0 || err == EOWNERDEAD) pthread_mutex_unlock(&header_->alive[r]);
    const int32_t pid = header_->pids[r].load();
    if (err == 0 && pid == 0) continue;
    return absl::UnavailableError(absl::StrCat(
        "local rank ", r, " (pid ", pid, ") ", err == 0 ? "exited" : "died",
        " while this rank waited for it (", what, ")"));
  }
  if (absl::Now() > op.deadline) {
    return absl::UnavailableError(absl::StrCat(
        "timed out after train.collective_timeout_s (", absl::FormatDuration(options_.timeout),
        ") waiting for the node's other ranks (", what, "): one of them hangs"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ShmNodeComm::WaitFor(absl::FunctionRef<bool()> ready, const Op& op,
                                          bool block, const char* what) {
  if (ready()) return true;
  if (!block) {
    if (absl::Status st = AbortedStatus(); !st.ok()) return st;
    return false;
  }
  absl::Status st = Await(header_->futex, ready, [&] { return Check(op, what); }, options_.wait);
  if (!st.ok()) return st;
  return true;
}

absl::StatusOr<bool> ShmNodeComm::AdvanceLocked(Op& op, bool block) {
  const int me = options_.local_rank;
  const int world = options_.local_world;
  // Broadcasts start at global rank 0: local rank 0 of node 0.
  const bool root = me == 0 && options_.group_rank == 0;
  RankWords& mine = header_->ranks[me];
  auto publish = [&](int word) {
    mine.words[word].store(op.round, std::memory_order_release);
    Notify(header_->futex);
  };
  while (true) {
    switch (op.stage) {
      case Stage::kBegin: {
        if (op.offset == op.bytes) return true;
        op.round = ++round_;
        op.chunk = std::min(slot_bytes_, op.bytes - op.offset);
        op.stage = op.kind == Kind::kSum || me == 0 ? Stage::kDeposit : Stage::kAwaitResult;
        break;
      }
      case Stage::kDeposit: {
        // The slot set is free once every rank finished the round that last used it.
        const uint64_t previous = op.round >= 2 ? op.round - 2 : 0;
        DDP_ASSIGN_OR_RETURN(bool ready,
                             WaitFor([&] { return AllAtLeast(kFinished, previous); }, op, block,
                                     "slots of round r-2"));
        if (!ready) return false;
        if (op.kind == Kind::kSum) {
          std::memcpy(Slot(op.round, me), op.data + op.offset, op.chunk);
          publish(kDeposited);
          op.stage = Stage::kReduce;
        } else {
          if (root || !multi_node()) std::memcpy(Slot(op.round, 0), op.data + op.offset, op.chunk);
          if (multi_node()) {
            if (cross_ == nullptr) return absl::InternalError("node leader without a CrossNode");
            DDP_ASSIGN_OR_RETURN(op.cross, cross_->StartBroadcast(Slot(op.round, 0), op.chunk));
            op.stage = Stage::kCross;
          } else {
            header_->result_ready.store(op.round, std::memory_order_release);
            op.stage = Stage::kCopyOut;
          }
        }
        break;
      }
      case Stage::kReduce: {
        DDP_ASSIGN_OR_RETURN(bool ready, WaitFor([&] { return AllAtLeast(kDeposited, op.round); },
                                                 op, block, "deposits"));
        if (!ready) return false;
        const size_t elem = op.dtype == ShmDType::kFloat32 ? sizeof(float) : sizeof(double);
        const size_t n = op.chunk / elem;
        char* slots[kMaxLocalRanks];
        for (int r = 0; r < world; ++r) slots[r] = Slot(op.round, r);
        if (!multi_node() && (world == 2 || op.chunk * (world - 2) <= options_.whole_chunk_bytes)) {
          // One barrier instead of two: every rank sums the whole chunk itself, in the
          // same order (so the same bits), straight into its buffer. With two ranks
          // this moves no more data than splitting the chunk; with more, only small
          // chunks are worth the extra reads.
          char* out = op.data + op.offset;
          if (op.dtype == ShmDType::kFloat32) {
            SumSlotsInto<float>(reinterpret_cast<float*>(out), slots, world, n);
          } else {
            SumSlotsInto<double>(reinterpret_cast<double*>(out), slots, world, n);
          }
          publish(kFinished);
          op.offset += op.chunk;
          op.stage = Stage::kBegin;
          break;
        }
        const size_t part = RoundUp((n + world - 1) / world, kAlign / elem);
        const size_t lo = std::min(n, me * part), hi = std::min(n, lo + part);
        if (op.dtype == ShmDType::kFloat32) {
          SumSlots<float>(slots, world, lo, hi);
        } else {
          SumSlots<double>(slots, world, lo, hi);
        }
        publish(kReduced);
        op.stage = multi_node() && me != 0 ? Stage::kAwaitResult : Stage::kAwaitReduced;
        break;
      }
      case Stage::kAwaitReduced: {
        DDP_ASSIGN_OR_RETURN(bool ready, WaitFor([&] { return AllAtLeast(kReduced, op.round); },
                                                 op, block, "partial sums"));
        if (!ready) return false;
        if (multi_node()) {  // The leader: sum with the other nodes' leaders.
          if (cross_ == nullptr) return absl::InternalError("node leader without a CrossNode");
          const size_t elem = op.dtype == ShmDType::kFloat32 ? sizeof(float) : sizeof(double);
          DDP_ASSIGN_OR_RETURN(op.cross,
                               cross_->StartSum(Slot(op.round, 0), op.chunk / elem, op.dtype));
          op.stage = Stage::kCross;
        } else {
          op.stage = Stage::kCopyOut;
        }
        break;
      }
      case Stage::kCross: {
        if (!block && !op.cross->Done()) return false;
        DDP_RETURN_IF_ERROR(op.cross->Wait());
        op.cross.reset();
        header_->result_ready.store(op.round, std::memory_order_release);
        Notify(header_->futex);
        op.stage = Stage::kCopyOut;
        break;
      }
      case Stage::kAwaitResult: {
        DDP_ASSIGN_OR_RETURN(
            bool ready,
            WaitFor([&] { return header_->result_ready.load(std::memory_order_acquire) >= op.round; },
                    op, block, "the node leader's result"));
        if (!ready) return false;
        op.stage = Stage::kCopyOut;
        break;
      }
      case Stage::kCopyOut: {
        if (!(op.kind == Kind::kBroadcast && root)) {
          std::memcpy(op.data + op.offset, Slot(op.round, 0), op.chunk);
        }
        publish(kFinished);
        op.offset += op.chunk;
        op.stage = Stage::kBegin;
        break;
      }
    }
  }
}

}  // namespace ddp
