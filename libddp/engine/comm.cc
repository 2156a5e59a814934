#include "libddp/engine/comm.h"

#include <torch/cuda.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if DDP_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <stdlib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/cord.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "libddp/engine/recovery.h"
#include "libddp/engine/shm_comm.h"
#include "libddp/engine/store_probe.h"

namespace ddp {

// How this rank's group waits for its collectives (shared by the Comm, its leaders'
// CrossNode and its pending sums): up to the collective timeout, and, under ddp-worker
// (a generation file), no longer than until a newer generation is announced there.
struct WaitRules {
  std::chrono::milliseconds timeout{0};
  std::string generation_file;  // Empty: nobody announces generations.
  int generation = 0;
  // A wait gave up on a collective that still runs in the group's threads.
  std::atomic<bool> abandoned{false};
};

namespace {

// How often a wait under ddp-worker looks at the generation file.
constexpr std::chrono::milliseconds kGenerationPoll{250};

std::string FirstLine(const std::exception& e) {
  std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || absl::StartsWith(addr, "127.");
}

std::shared_ptr<::gloo::transport::Device> GlooDevice(const Environment& env) {
  // All ranks on this host: the loopback device. Otherwise PyTorch's own rules:
  // GLOO_SOCKET_IFNAME, else the address this host's name resolves to.
  if (IsLoopback(env.master_addr)) {
    return c10d::ProcessGroupGloo::createDeviceForHostname(env.master_addr == "::1" ? "::1"
                                                                                   : "127.0.0.1");
  }
  if (!env.gloo_socket_ifname.empty()) {
    return c10d::ProcessGroupGloo::createDeviceForInterface(env.gloo_socket_ifname);
  }
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

// Every rank announces itself in the store and waits for all the others, so that a
// rank that never starts fails the job after rdzv.timeout_s with the missing ranks
// named, rather than as an opaque process-group timeout.
absl::Status RendezvousBarrier(c10d::Store& store, const Environment& env,
                               std::chrono::milliseconds timeout) {
  auto key = [](int r) { return absl::StrCat("rdzv/rank/", r); };
  std::vector<std::string> keys;
  for (int r = 0; r < env.world_size; ++r) keys.push_back(key(r));
  try {
    store.set(key(env.rank), std::vector<uint8_t>{1});
    store.wait(keys, timeout);
  } catch (const std::exception& e) {
    std::vector<int> missing;
    try {
      for (int r = 0; r < env.world_size; ++r) {
        if (!store.check({key(r)})) missing.push_back(r);
      }
    } catch (const std::exception&) {
      // The store itself went away (rank 0 died): report the original error.
    }
    return absl::UnavailableError(absl::StrCat(
        "rendezvous incomplete after rdzv.timeout_s (",
        std::chrono::duration<double>(timeout).count(), "s): ",
        missing.empty() ? FirstLine(e)
                        : absl::StrCat("ranks [", absl::StrJoin(missing, ", "),
                                       "] never arrived")));
  }
  return absl::OkStatus();
}

// The rendezvous store as the shared-memory setup sees it.
class StoreRendezvous : public ShmRendezvous {
 public:
  explicit StoreRendezvous(c10d::Store& store) : store_(store) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    try {
      store_.set(key, std::vector<uint8_t>(value.begin(), value.end()));
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("rendezvous store: ", FirstLine(e)));
    }
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key) override {
    try {
      std::vector<uint8_t> v = store_.get(key);  // Waits up to rdzv.timeout_s.
      return std::string(v.begin(), v.end());
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("rendezvous store: waiting for ", key, ": ",
                                                 FirstLine(e)));
    }
  }

 private:
  c10d::Store& store_;
};

at::ScalarType TorchType(ShmDType dtype) {
  return dtype == ShmDType::kFloat32 ? at::kFloat : at::kDouble;
}

// A c10d work item, waited on with the collective timeout. Under ddp-worker the wait
// also ends (UNAVAILABLE, so a live recovery follows) once a newer generation is
// announced: the coordinator is replacing a peer, and one that went silent (its host
// cut off or powered off) would otherwise hold this rank until the timeout, since no
// socket of it ever closes. The collective then still runs in the group's threads until
// it fails by itself, so the group is never destroyed (Comm::~Comm).
absl::Status WaitWork(const c10::intrusive_ptr<c10d::Work>& work, WaitRules& rules,
                      const char* what) {
  try {
    if (rules.generation_file.empty()) {
      work->wait(rules.timeout);
      return absl::OkStatus();
    }
    const auto deadline = std::chrono::steady_clock::now() + rules.timeout;
    while (true) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      try {
        // Gloo's wait throws when the time is up and the work is not complete.
        work->wait(std::clamp(left, std::chrono::milliseconds(1), kGenerationPoll));
        return absl::OkStatus();
      } catch (const std::exception&) {
        if (work->isCompleted()) {
          work->wait();  // Completed meanwhile, or failed: its own error, if any.
          return absl::OkStatus();
        }
        if (left <= kGenerationPoll) throw;
      }
      if (std::optional<GenerationNews> next =
              NewerGeneration(rules.generation_file, rules.generation)) {
        rules.abandoned = true;
        return absl::UnavailableError(absl::StrCat(
            what, " abandoned: generation ", next->generation, " was announced while this rank waited ",
            "(the coordinator is replacing a lost peer)"));
      }
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        what, " failed (a peer died or hung past train.collective_timeout_s): ", FirstLine(e)));
  }
}

// Groups whose collectives were abandoned (WaitWork): kept until the process ends, as
// destroying one would wait for its threads, and they for the abandoned collective.
void KeepUntilExit(CommBackendPtr group) {
  if (!group) return;
  static std::mutex mu;
  static auto* kept = new std::vector<CommBackendPtr>();  // Never destroyed.
  std::lock_guard<std::mutex> lock(mu);
  kept->push_back(std::move(group));
}

// The node leaders' collectives, over their own process group, in place on the
// node's shared memory.
class LeadersCrossNode : public CrossNode {
 public:
  LeadersCrossNode(CommBackendPtr leaders, std::shared_ptr<WaitRules> rules)
      : leaders_(std::move(leaders)), rules_(std::move(rules)) {}

  absl::StatusOr<std::unique_ptr<CrossNodeOp>> StartSum(void* data, size_t count,
                                                        ShmDType dtype) override {
    std::vector<at::Tensor> t = {
        at::from_blob(data, {static_cast<int64_t>(count)}, TorchType(dtype))};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    opts.timeout = rules_->timeout;
    return Start([&] { return leaders_->allreduce(t, opts); }, "the node leaders' all-reduce");
  }

  absl::StatusOr<std::unique_ptr<CrossNodeOp>> StartBroadcast(void* data, size_t bytes) override {
    std::vector<at::Tensor> t = {at::from_blob(data, {static_cast<int64_t>(bytes)}, at::kByte)};
    c10d::BroadcastOptions opts;
    opts.rootRank = 0;
    opts.timeout = rules_->timeout;
    return Start([&] { return leaders_->broadcast(t, opts); }, "the node leaders' broadcast");
  }

 private:
  class Op : public CrossNodeOp {
   public:
    Op(c10::intrusive_ptr<c10d::Work> work, std::shared_ptr<WaitRules> rules, const char* what)
        : work_(std::move(work)), rules_(std::move(rules)), what_(what) {}
    bool Done() override { return work_->isCompleted(); }
    absl::Status Wait() override { return WaitWork(work_, *rules_, what_); }

   private:
    c10::intrusive_ptr<c10d::Work> work_;
    std::shared_ptr<WaitRules> rules_;
    const char* what_;
  };

  absl::StatusOr<std::unique_ptr<CrossNodeOp>> Start(
      const std::function<c10::intrusive_ptr<c10d::Work>()>& op, const char* what) {
    try {
      return std::make_unique<Op>(op(), rules_, what);
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(what, " failed: ", FirstLine(e)));
    }
  }

  CommBackendPtr leaders_;
  std::shared_ptr<WaitRules> rules_;
};

class DonePendingSum : public PendingSum {
 public:
  explicit DonePendingSum(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }

 private:
  absl::Status status_;
};

class WorkPendingSum : public PendingSum {
 public:
  // `stream_ordered`: an NCCL all-reduce of GPU tensors, waited on as PyTorch's DDP
  // does: the current CUDA stream waits for NCCL's, and the host goes on (no sync per
  // bucket; what reads the gradients is queued behind the all-reduce). Its timeout is
  // then NCCL's watchdog's (the group's collective timeout), which ends the process; in
  // a step captured in a CUDA graph no work is left for the watchdog, and the trainer's
  // next wait for the GPU (WaitForDevice, with the same timeout) reports the peer instead.
  // Otherwise (Gloo) the host waits, up to the collective timeout.
  WorkPendingSum(c10::intrusive_ptr<c10d::Work> work, std::shared_ptr<WaitRules> rules,
                 bool stream_ordered)
      : work_(std::move(work)), rules_(std::move(rules)), stream_ordered_(stream_ordered) {}
  absl::Status Wait() override {
    if (!stream_ordered_) return WaitWork(work_, *rules_, "all-reduce");
    try {
      work_->wait();  // No timeout: in LibTorch 2.x a timeout makes wait() block the host.
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat("all-reduce failed: ", FirstLine(e)));
    }
    return absl::OkStatus();
  }

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::shared_ptr<WaitRules> rules_;
  bool stream_ordered_;
};

class ShmPendingSum : public PendingSum {
 public:
  ShmPendingSum(ShmNodeComm* shm, ShmNodeComm::OpId id) : shm_(shm), id_(id) {}
  absl::Status Wait() override { return shm_->Wait(id_); }

 private:
  ShmNodeComm* shm_;
  ShmNodeComm::OpId id_;
};

// `st` (not OK) saying which collective failed: "... (in all-reduce #63 (bucket 0, 2.7
// kB))", its code and payloads (a failure's kind) kept.
absl::Status InCollective(const absl::Status& st, const std::string& collective) {
  absl::Status out(st.code(), absl::StrCat(st.message(), " (in ", collective, ")"));
  st.ForEachPayload([&](absl::string_view url, const absl::Cord& payload) {
    out.SetPayload(url, payload);
  });
  return out;
}

// The recorded collective `seq` ended with `st`: marked complete, and `st` naming it if
// it failed.
absl::Status Completed(flight::Recorder& recorder, uint64_t seq, absl::Status st) {
  recorder.Exit(seq);
  return st.ok() ? st : InCollective(st, recorder.Describe(seq));
}

// A sum as the flight recorder sees it: entered when started, completed when waited for
// (a failure says which collective it was).
class RecordedPendingSum : public PendingSum {
 public:
  RecordedPendingSum(std::unique_ptr<PendingSum> sum, std::shared_ptr<flight::Recorder> recorder,
                     uint64_t bytes, int bucket)
      : sum_(std::move(sum)),
        recorder_(std::move(recorder)),
        seq_(recorder_->Enter(flight::Kind::kAllReduce, bytes, bucket)) {}
  ~RecordedPendingSum() override {
    if (!waited_) recorder_->Exit(seq_);
  }
  absl::Status Wait() override {
    absl::Status st;
    {
      flight::PhaseScope waiting(recorder_.get(), flight::Phase::kCommWait);
      st = sum_->Wait();
    }
    waited_ = true;
    return Completed(*recorder_, seq_, std::move(st));
  }

 private:
  std::unique_ptr<PendingSum> sum_;
  std::shared_ptr<flight::Recorder> recorder_;
  uint64_t seq_;
  bool waited_ = false;
};

std::optional<ShmDType> ShmTypeOf(const at::Tensor& t) {
  if (!t.device().is_cpu() || !t.is_contiguous()) return std::nullopt;
  if (t.scalar_type() == at::kFloat) return ShmDType::kFloat32;
  if (t.scalar_type() == at::kDouble) return ShmDType::kFloat64;
  return std::nullopt;
}

}  // namespace

absl::StatusOr<DeviceChoice> ChooseDevice(const DeviceRequest& request, const Environment& env) {
  using Backend = DeviceRequest::Backend;
  using Device = DeviceRequest::Device;
  const Backend backend = request.backend;
  const Device device = request.device;
  if (device == Device::kCpu && backend == Backend::kNccl) {
    return absl::InvalidArgumentError(
        "device cpu with backend nccl: NCCL reduces GPU tensors only (use gloo or auto)");
  }
  const bool cuda = torch::cuda::is_available();
  DeviceChoice choice;
  const bool on_gpu = device == Device::kCuda ||
                      (device == Device::kAuto && (backend == Backend::kNccl ||
                                                   (backend == Backend::kAuto && cuda)));
  choice.backend = backend == Backend::kGloo || (backend == Backend::kAuto && !on_gpu)
                       ? "gloo" : "nccl";
  if (!on_gpu) return choice;
  const std::string what = absl::StrCat("backend ", choice.backend, " on device cuda");
#if DDP_WITH_CUDA
  if (!cuda) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " needs a CUDA GPU, and none is visible to this rank"));
  }
  const int gpus = static_cast<int>(torch::cuda::device_count());
  choice.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank % gpus));
  return choice;
#else
  return absl::FailedPreconditionError(absl::StrCat(
      what, " needs ddp-trainer or libddp built against a CUDA LibTorch (this build is "
      "CPU-only; docs/torch.md)"));
#endif
}

namespace {

// DDP_FLIGHT_RECORDER's file, or memory (outside ddp-worker, or when the file cannot be
// made: the worker then sees no recorder, and the rank says why).
std::shared_ptr<flight::Recorder> OpenRecorder(const Environment& env) {
  if (!env.flight_recorder.empty()) {
    absl::StatusOr<std::unique_ptr<flight::Recorder>> file =
        flight::Recorder::OpenFile(env.flight_recorder, env.rank);
    if (file.ok()) return std::move(*file);
    DDP_LOG(WARNING) << file.status().message() << "; the flight recorder stays in memory";
  }
  return std::make_shared<flight::Recorder>();
}

}  // namespace

absl::StatusOr<Comm> Comm::Connect(const Environment& env, const DeviceChoice& device,
                                   const CommOptions& options) {
  const std::chrono::milliseconds rdzv_timeout = options.rdzv_timeout;
  const std::chrono::milliseconds collective_timeout = options.collective_timeout;
  Comm c;
  c.rank_ = env.rank;
  c.world_size_ = env.world_size;
  c.device_ = device.device;
  c.timeout_ = collective_timeout;
  c.wait_ = std::make_shared<WaitRules>();
  c.wait_->timeout = collective_timeout;
  c.wait_->generation_file = env.generation_file;
  c.wait_->generation = env.generation;
  c.backend_name_ = device.backend;
  c.recorder_ = OpenRecorder(env);
  // Rank 0 hosts the store, unless torchrun's agent already does (its static
  // rendezvous, TORCHELASTIC_USE_AGENT_STORE=True: what init_process_group does too).
  const bool host_store = env.rank == 0 && !env.use_agent_store;
  if (!host_store) {
    // TCPStore's client sleeps a whole second after a refused connection, and rank 0
    // usually opens the store a little after the others get here: wait for the
    // listener ourselves, in milliseconds, so that the client connects at once.
    (void)WaitForTcpListener(env.master_addr, env.master_port, absl::FromChrono(rdzv_timeout));
  }
  try {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(env.master_port);
    opts.isServer = host_store;
    opts.numWorkers = static_cast<size_t>(env.world_size);
    opts.waitWorkers = false;  // Our own barrier below says who is missing.
    opts.timeout = rdzv_timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
    // Every key of this job's attempt, ours and the process group's, lives under one
    // prefix (as torchrun scopes its store per restart).
    // A live recovery's generation forms on a fresh store, under its own prefix too.
    c.store_ = c10::make_intrusive<c10d::PrefixStore>(
        absl::StrCat("ddp/", env.job_id, "/", env.attempt,
                     env.generation > 0 ? absl::StrCat("/g", env.generation) : ""),
        tcp);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        host_store ? "cannot host" : "cannot reach", " the rendezvous store at ",
        env.master_addr, ":", env.master_port, " within rdzv.timeout_s: ", FirstLine(e)));
  }
  DDP_RETURN_IF_ERROR(RendezvousBarrier(*c.store_, env, rdzv_timeout));
  try {
    if (device.backend == "gloo") {
      auto opts = c10d::ProcessGroupGloo::Options::create(collective_timeout);
      opts->devices.push_back(GlooDevice(env));
      c.backend_ = c10::make_intrusive<c10d::ProcessGroupGloo>(c.store_, env.rank,
                                                               env.world_size, opts);
    } else {
#if DDP_WITH_CUDA
      // The gradient buckets' all-reduces are stream-ordered (WorkPendingSum): a dead or
      // hung peer there ends the process through NCCL's watchdog after the collective
      // timeout (its message names the collective; exit by SIGABRT, a retryable failure).
      // So are the broadcasts of tensors on the GPU (the buffers before each training
      // forward, decision 173). Inside a step captured in a CUDA graph the watchdog sees
      // neither: the trainer's wait for the GPU (WaitForDevice, the same timeout) names
      // the failure, a retryable UNAVAILABLE. The other collectives (set-up, sums) wait on
      // the host with the timeout and fail with an exception that names them. TORCH_NCCL_BLOCKING_WAIT=1 in a
      // job's `env` makes every wait block the host, as before decision 147.
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = collective_timeout;
      c.backend_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(c.store_, env.rank,
                                                               env.world_size, opts);
#else
      return absl::FailedPreconditionError("NCCL is not built into this ddp-trainer");
#endif
    }
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot form the ", device.backend, " process group: ", FirstLine(e)));
  }
  if (options.intra_node != CommOptions::IntraNode::kGloo && device.device.is_cpu() &&
      env.world_size > 1) {
    DDP_RETURN_IF_ERROR(c.SetUpNodeGroup(env, options.intra_node));
  } else if (options.intra_node == CommOptions::IntraNode::kShm && !device.device.is_cpu()) {
    return absl::FailedPreconditionError(
        "train.intra_node_comm: shm reduces CPU tensors, but this rank trains on " +
        device.device.str() + " (use auto or gloo)");
  }
  return c;
}

Comm::Comm(Comm&&) = default;
Comm& Comm::operator=(Comm&&) = default;
Comm::~Comm() {
  if (wait_ != nullptr && wait_->abandoned) {
    KeepUntilExit(std::move(backend_));
    KeepUntilExit(std::move(leaders_));
  }
}

absl::Status Comm::SetUpNodeGroup(const Environment& env, CommOptions::IntraNode mode) {
  const int local_world = env.local_world_size;
  // Node leaders' ranks are derived, so ranks must be numbered node by node.
  const bool layout_ok = local_world > 1 && env.world_size % local_world == 0 &&
                         env.rank == env.group_rank * local_world + env.local_rank;
  const int nodes = layout_ok ? env.world_size / local_world : 0;
  absl::Status local = absl::OkStatus();
  std::unique_ptr<ShmNodeComm> shm;
  if (layout_ok) {
    ShmNodeComm::Options o;
    o.job_id = env.job_id;
    o.attempt = env.attempt;
    o.group_rank = env.group_rank;
    o.nodes = nodes;
    o.local_rank = env.local_rank;
    o.local_world = local_world;
    o.timeout = absl::FromChrono(timeout_);
    StoreRendezvous rendezvous(*store_);
    absl::StatusOr<std::unique_ptr<ShmNodeComm>> created = ShmNodeComm::Create(o, rendezvous);
    if (created.ok()) {
      shm = *std::move(created);
    } else {
      local = created.status();
    }
  }
  // Every rank votes (MIN over the job), so that all of them use the same scheme:
  // [numbered node by node, shared memory up, LOCAL_WORLD_SIZE, -LOCAL_WORLD_SIZE].
  at::Tensor votes = at::tensor(
      std::vector<int64_t>{layout_ok, layout_ok && local.ok(), local_world, -local_world},
      at::TensorOptions().dtype(at::kLong));
  {
    std::vector<at::Tensor> t = {votes};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::MIN;
    opts.timeout = timeout_;
    DDP_RETURN_IF_ERROR(Run("intra-node communication vote", flight::Kind::kAllReduce,
                            votes.nbytes(), [&] { return backend_->allreduce(t, opts); }));
  }
  const int64_t* v = votes.data_ptr<int64_t>();
  const bool one_per_node = v[2] == 1 && -v[3] == 1;
  const bool shm_everywhere = v[0] == 1 && v[1] == 1 && v[2] == -v[3];
  const char* fallback = "; ranks on a node all-reduce through the backend (set "
                         "train.intra_node_comm: gloo to skip shared memory)";
  if (one_per_node) {
    // Nothing to share on any node: the backend alone is exactly the hierarchy.
    return absl::OkStatus();
  }
  if (v[0] != 1 || v[2] != -v[3]) {
    const std::string why =
        "shared memory needs the same LOCAL_WORLD_SIZE on every node and ranks numbered node "
        "by node (RANK = GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK)";
    if (mode == CommOptions::IntraNode::kShm) {
      return absl::FailedPreconditionError(absl::StrCat("train.intra_node_comm: shm: ", why));
    }
    DDP_LOG(WARNING) << why << fallback;
    return absl::OkStatus();
  }
  if (!shm_everywhere) {
    const std::string why =
        local.ok() ? "shared memory could not be set up on another node (see its log)"
                   : absl::StrCat("shared memory could not be set up: ", local.message());
    if (mode == CommOptions::IntraNode::kShm) {
      return absl::UnavailableError(absl::StrCat("train.intra_node_comm: shm: ", why));
    }
    DDP_LOG(WARNING) << why << fallback;
    return absl::OkStatus();
  }
  if (nodes > 1 && env.local_rank == 0) {
    try {
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout_);
      opts->devices.push_back(GlooDevice(env));
      leaders_ = c10::make_intrusive<c10d::ProcessGroupGloo>(
          c10::make_intrusive<c10d::PrefixStore>("leaders", store_), env.group_rank, nodes, opts);
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("cannot form the node leaders' process group: ", FirstLine(e)));
    }
    cross_ = std::make_unique<LeadersCrossNode>(leaders_, wait_);
    shm->SetCrossNode(cross_.get());
  }
  shm_ = std::move(shm);
  return absl::OkStatus();
}

std::string Comm::intra_node_comm() const { return shm_ ? "shm" : backend_name_; }

std::unique_ptr<PendingSum> Comm::StartSum(const at::Tensor& flat, int bucket) {
  if (world_size_ == 1) return std::make_unique<DonePendingSum>(absl::OkStatus());
  const uint64_t bytes = flat.numel() * static_cast<uint64_t>(flat.element_size());
  auto recorded = [&](std::unique_ptr<PendingSum> sum) -> std::unique_ptr<PendingSum> {
    return std::make_unique<RecordedPendingSum>(std::move(sum), recorder_, bytes, bucket);
  };
  if (std::optional<ShmDType> dtype = ShmTypeOf(flat); shm_ && dtype) {
    return recorded(std::make_unique<ShmPendingSum>(
        shm_.get(), shm_->StartSum(flat.data_ptr(), static_cast<size_t>(flat.numel()), *dtype)));
  }
  std::vector<at::Tensor> tensors = {flat};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  opts.timeout = timeout_;
  try {
    const bool stream_ordered = flat.is_cuda() && backend_name_ == "nccl";
    return recorded(std::make_unique<WorkPendingSum>(backend_->allreduce(tensors, opts), wait_,
                                                     stream_ordered));
  } catch (const std::exception& e) {
    return std::make_unique<DonePendingSum>(
        absl::UnavailableError(absl::StrCat("all-reduce failed to start: ", FirstLine(e))));
  }
}

void Comm::Poll() {
  if (shm_) shm_->Poll();
}

absl::Status Comm::Recorded(flight::Kind kind, uint64_t bytes,
                            const std::function<absl::Status()>& body) {
  const uint64_t seq = recorder_->Enter(kind, bytes);
  return Completed(*recorder_, seq, body());
}

absl::Status Comm::Run(const char* what, flight::Kind kind, uint64_t bytes,
                       const std::function<c10::intrusive_ptr<c10d::Work>()>& op) {
  const uint64_t seq = recorder_->Enter(kind, bytes);
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = op();
  } catch (const std::exception& e) {
    const std::string why = absl::StrCat(what, " failed to start: ", FirstLine(e));
    return Completed(*recorder_, seq, absl::UnavailableError(why));
  }
  return Completed(*recorder_, seq, Wait(work, what));
}

absl::Status Comm::Wait(const c10::intrusive_ptr<c10d::Work>& work, const char* what) {
  return WaitWork(work, *wait_, what);
}

absl::Status Comm::Broadcast(const std::vector<at::Tensor>& tensors) {
  // Alone, every tensor already holds rank 0's values (and a step captured in a CUDA
  // graph must not wait on the host, which the backend's wait does).
  if (world_size_ == 1) return absl::OkStatus();
  // One flat broadcast per dtype (parameters are float; buffers may be integers).
  std::vector<at::ScalarType> dtypes;
  for (const at::Tensor& t : tensors) {
    if (std::find(dtypes.begin(), dtypes.end(), t.scalar_type()) == dtypes.end()) {
      dtypes.push_back(t.scalar_type());
    }
  }
  for (at::ScalarType dtype : dtypes) {
    std::vector<at::Tensor> group, flat_parts;
    for (const at::Tensor& t : tensors) {
      if (t.scalar_type() != dtype) continue;
      group.push_back(t);
      flat_parts.push_back(t.detach().reshape({-1}));
    }
    std::vector<at::Tensor> buf = {at::cat(flat_parts)};
    absl::Status st;
    if (shm_ && buf[0].device().is_cpu()) {
      st = Recorded(flight::Kind::kBroadcast, buf[0].nbytes(),
                    [&] { return shm_->Broadcast(buf[0].data_ptr(), buf[0].nbytes()); });
    } else {
      c10d::BroadcastOptions opts;
      opts.rootRank = 0;
      opts.timeout = timeout_;
      if (buf[0].is_cuda() && backend_name_ == "nccl") {
        // Stream-ordered, as the gradients' all-reduce (WorkPendingSum): the copies below
        // wait on the GPU, the host goes on, and a CUDA graph can hold it (BatchNorm's
        // buffers before every training forward). NCCL's watchdog bounds it (outside a
        // graph; inside one, the trainer's WaitForDevice).
        st = Recorded(flight::Kind::kBroadcast, buf[0].nbytes(), [&] {
          return WorkPendingSum(backend_->broadcast(buf, opts), wait_, /*stream_ordered=*/true)
              .Wait();
        });
      } else {
        st = Run("broadcast", flight::Kind::kBroadcast, buf[0].nbytes(),
                 [&] { return backend_->broadcast(buf, opts); });
      }
    }
    if (!st.ok()) return st;
    at::NoGradGuard no_grad;
    int64_t offset = 0;
    for (const at::Tensor& t : group) {
      t.copy_(buf[0].narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<char>> Comm::BroadcastBytes(const std::vector<char>& bytes) {
  const at::TensorOptions opts = at::TensorOptions().device(device_);
  at::Tensor size = at::full({1}, rank_ == 0 ? static_cast<int64_t>(bytes.size()) : 0,
                             opts.dtype(at::kLong));
  absl::Status st = Broadcast({size});
  if (!st.ok()) return st;
  const int64_t n = size.cpu().item<int64_t>();
  if (n == 0) return std::vector<char>();
  at::Tensor data = at::empty({n}, opts.dtype(at::kByte));
  if (rank_ == 0) {
    data.copy_(at::from_blob(const_cast<char*>(bytes.data()), {n}, at::kByte));
  }
  st = Broadcast({data});
  if (!st.ok()) return st;
  at::Tensor host = data.cpu();
  return std::vector<char>(static_cast<char*>(host.data_ptr()),
                           static_cast<char*>(host.data_ptr()) + n);
}

absl::StatusOr<std::vector<char>> Comm::BroadcastBytesFrom(int root,
                                                           const std::vector<char>& bytes,
                                                           const char* what) {
  const at::TensorOptions opts = at::TensorOptions().device(device_);
  const std::string op = absl::StrCat(what, " from rank ", root);
  auto broadcast = [&](at::Tensor& t) -> absl::Status {
    std::vector<at::Tensor> tensors = {t};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = timeout_;
    return Run(op.c_str(), flight::Kind::kBroadcast, t.nbytes(),
               [&] { return backend_->broadcast(tensors, o); });
  };
  const bool me = rank_ == root;
  at::Tensor size = at::full({1}, me ? static_cast<int64_t>(bytes.size()) : 0,
                             opts.dtype(at::kLong));
  DDP_RETURN_IF_ERROR(broadcast(size));
  const int64_t n = size.cpu().item<int64_t>();
  if (n == 0) return std::vector<char>();
  at::Tensor data = at::empty({n}, opts.dtype(at::kByte));
  if (me) data.copy_(at::from_blob(const_cast<char*>(bytes.data()), {n}, at::kByte));
  DDP_RETURN_IF_ERROR(broadcast(data));
  at::Tensor host = data.cpu();
  const char* p = static_cast<const char*>(host.data_ptr());
  return std::vector<char>(p, p + n);
}

absl::Status Comm::AllReduceSum(at::Tensor& tensor) {
  const int64_t bytes = tensor.numel() * static_cast<int64_t>(tensor.element_size());
  all_reduce_sum_bytes_ += bytes;
  if (std::optional<ShmDType> dtype = ShmTypeOf(tensor); shm_ && dtype) {
    return Recorded(flight::Kind::kAllReduce, bytes, [&] {
      return shm_->Sum(tensor.data_ptr(), static_cast<size_t>(tensor.numel()), *dtype);
    });
  }
  std::vector<at::Tensor> tensors = {tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  opts.timeout = timeout_;
  return Run("all-reduce", flight::Kind::kAllReduce, bytes,
             [&] { return backend_->allreduce(tensors, opts); });
}

absl::StatusOr<std::vector<double>> Comm::MaxOverRanks(const std::vector<double>& values) {
  std::vector<at::Tensor> tensors = {
      at::tensor(values, at::TensorOptions().dtype(at::kDouble)).to(device_)};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::MAX;
  opts.timeout = timeout_;
  DDP_RETURN_IF_ERROR(Run("all-reduce (max)", flight::Kind::kAllReduce,
                          values.size() * sizeof(double),
                          [&] { return backend_->allreduce(tensors, opts); }));
  const at::Tensor host = tensors[0].cpu();
  return std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel());
}

absl::Status Comm::Barrier() {
  c10d::BarrierOptions opts;
  opts.timeout = timeout_;
  return Run("barrier", flight::Kind::kBarrier, 0, [&] { return backend_->barrier(opts); });
}

}  // namespace ddp
