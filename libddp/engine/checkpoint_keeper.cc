#include "libddp/engine/checkpoint_keeper.h"

#include <ATen/CPUGeneratorImpl.h>

#include <glob.h>

#include <cstring>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace ddp {
namespace {

// Payload kinds of the holder's broadcast.
constexpr char kCheckpoint = 'C';
constexpr char kUnreadable = 'U';

}  // namespace

at::Tensor CpuRngState() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

absl::StatusOr<at::Tensor> RankZeroRngState(Comm& comm, const at::Device& device) {
  at::Tensor rng = CpuRngState();
  if (comm.world_size() > 1) {
    at::Tensor shared = rng.to(device);
    DDP_RETURN_IF_ERROR(comm.Broadcast({shared}));
    rng = shared.cpu();
  }
  return rng;
}

void RestoreRngState(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

std::string CheckpointDirFor(const std::string& dir, const Environment& env) {
  return absl::StrReplaceAll(dir, {{"{job_id}", env.job_id}, {"{node}", FileNameToken(env.node)}});
}

CheckpointKeeper::CheckpointKeeper(Options options, const Environment& env, Comm* comm,
                                   at::Device device)
    : options_(std::move(options)),
      env_(env),
      comm_(comm),
      device_(device),
      store_(CheckpointStore::Options{options_.dir, absl::StrCat(env.job_id, ".", env.node),
                                      options_.keep, env.debug_checkpoint_stall, env.attempt}) {}

absl::Status CheckpointKeeper::ClaimDirectories() {
  DDP_RETURN_IF_ERROR(store_.Claim());
  if (!absl::StrContains(options_.dir_template, "{node}")) return absl::OkStatus();
  // Every node's own directory ({node}): a node this attempt no longer runs on may
  // still hold a rank of an attempt given up on; its writes there are fenced too.
  const std::string pattern =
      absl::StrReplaceAll(options_.dir_template, {{"{job_id}", env_.job_id}, {"{node}", "*"}});
  glob_t found{};
  if (::glob(pattern.c_str(), GLOB_ONLYDIR | GLOB_NOSORT, nullptr, &found) == 0) {
    for (size_t i = 0; i < found.gl_pathc; ++i) {
      const std::string dir = found.gl_pathv[i];
      if (dir == store_.dir()) continue;
      CheckpointStore::Options o;
      o.dir = dir;
      o.attempt = env_.attempt;
      if (absl::Status st = CheckpointStore(o).Claim(); !st.ok()) {
        DDP_LOG(WARNING) << "cannot fence " << dir << " for attempt " << env_.attempt << ": "
                         << st.message();
      }
    }
  }
  globfree(&found);
  return absl::OkStatus();
}

std::string CheckpointKeeper::MarkerPrefix() const {
  return absl::StrCat(".writer.", FileNameToken(env_.job_id), ".", env_.attempt, ".");
}

absl::Status CheckpointKeeper::Setup() {
  const bool candidate = env_.local_rank == 0;
  if (candidate) {
    // Only this node's earlier trainers of this job used our identity, and a restart
    // never overlaps the attempt before it on a node: their temporaries are dead.
    if (int n = store_.RemoveOwnTemporaries(); n > 0) {
      DDP_LOG(INFO) << "removed " << n << " temporary file(s) of checkpoint saves killed midway";
    }
  }
  writer_ = candidate;
  if (candidate) DDP_RETURN_IF_ERROR(ClaimDirectories());
  if (env_.world_size == 1) return absl::OkStatus();
  // Whose directory is whose: a candidate that sees a lower node's marker shares its
  // storage and leaves the writing to it.
  const std::string mine = absl::StrCat(MarkerPrefix(), env_.group_rank);
  if (candidate) {
    if (absl::Status st = store_.PutMarker(mine); !st.ok()) {
      DDP_LOG(WARNING) << st.message() << " (this node writes its own checkpoints)";
    }
  }
  DDP_RETURN_IF_ERROR(comm_->Barrier());
  if (candidate) {
    for (const std::string& marker : store_.Markers(MarkerPrefix())) {
      int group = -1;
      if (absl::SimpleAtoi(marker.substr(MarkerPrefix().size()), &group) &&
          group < env_.group_rank) {
        writer_ = false;
      }
    }
  }
  DDP_RETURN_IF_ERROR(comm_->Barrier());
  if (candidate) store_.RemoveMarker(mine);
  if (candidate && !writer_) {
    DDP_LOG(INFO) << "checkpoint directory " << store_.dir()
                  << " is shared with a lower node, which writes the checkpoints";
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<CheckpointKeeper::Restored>> CheckpointKeeper::Restore() {
  if (options_.resume == Options::Resume::kNo) return std::optional<Restored>();
  // What each node's writer candidate holds: [newest step + 1 per rank (0: none),
  // then 1 per rank that cannot list its directory], summed over ranks.
  int64_t held = -1;
  absl::Status list_error;
  if (env_.local_rank == 0) {
    auto steps = store_.Steps();
    if (!steps.ok()) {
      list_error = steps.status();
    } else if (!steps->empty()) {
      held = steps->back();
    }
  }
  const int world = env_.world_size;
  std::vector<double> local(2 * static_cast<size_t>(world), 0.0);
  local[env_.rank] = static_cast<double>(held + 1);
  local[world + env_.rank] = list_error.ok() ? 0 : 1;
  at::Tensor all = at::tensor(local, at::TensorOptions().dtype(at::kDouble)).to(device_);
  if (world > 1) DDP_RETURN_IF_ERROR(comm_->AllReduceSum(all));
  all = all.cpu();
  const double* v = all.data_ptr<double>();
  if (!list_error.ok()) return list_error;
  for (int r = 0; r < world; ++r) {
    if (v[world + r] > 0) {
      // Resuming from what the others hold could go back past a newer checkpoint.
      return absl::UnavailableError(absl::StrCat(
          "rank ", r, " cannot list its checkpoint directory (see its log): not resuming "
          "without knowing what it holds"));
    }
  }
  int64_t best = -1;
  int holder = -1;
  for (int r = 0; r < world; ++r) {
    const int64_t step = static_cast<int64_t>(v[r]) - 1;
    if (step > best) {
      best = step;
      holder = r;
    }
  }
  if (best < 0) return std::optional<Restored>();

  // The holder reads its file and sends it (with its path) to every rank: no shared
  // filesystem needed. First byte C(heckpoint) or U(nreadable: retryable).
  std::vector<char> payload;
  if (env_.rank == holder) {
    const std::string path = store_.PathFor(best);
    auto bytes = store_.Read(best);
    if (bytes.ok()) {
      payload.push_back(kCheckpoint);
      payload.insert(payload.end(), path.begin(), path.end());
      payload.push_back('\0');
      payload.insert(payload.end(), bytes->begin(), bytes->end());
    } else {
      // It exists but cannot be read: starting over would overwrite it later.
      payload.push_back(kUnreadable);
      payload.insert(payload.end(), bytes.status().message().begin(),
                     bytes.status().message().end());
    }
  }
  if (world > 1) {
    DDP_ASSIGN_OR_RETURN(payload, comm_->BroadcastBytesFrom(holder, payload, "sending the checkpoint"));
  }
  if (payload.empty() || payload[0] != kCheckpoint) {
    return absl::UnavailableError(payload.empty() ? std::string("empty checkpoint payload")
                                                  : std::string(payload.begin() + 1, payload.end()));
  }
  const auto nul = std::find(payload.begin() + 1, payload.end(), '\0');
  Restored out;
  out.path.assign(payload.begin() + 1, nul);
  out.holder = holder;
  DDP_ASSIGN_OR_RETURN(out.state,
                       DecodeCheckpoint(std::vector<char>(nul + (nul == payload.end() ? 0 : 1),
                                                          payload.end()),
                                        out.path));
  const CheckpointIdentity& id = out.state.identity;
  if (!id.job_id.empty() && id.job_id != env_.job_id &&
      options_.resume != Options::Resume::kForce) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", out.path, " (step ", best, ") was written by job ", id.job_id,
        " (attempt ", id.attempt, "), and this is job ", env_.job_id,
        ": refusing to resume another job's checkpoint. Give each job its own directory "
        "({job_id} in checkpoint.dir), move it away, or set checkpoint.resume: force"));
  }
  return std::optional<Restored>(std::move(out));
}

absl::StatusOr<std::string> CheckpointKeeper::Save(TrainingState state) {
  if (!writer_) return std::string();
  state.identity.job_id = env_.job_id;
  state.identity.attempt = env_.attempt;
  state.identity.node = env_.node;
  const int64_t step = state.position.global_step;
  DDP_RETURN_IF_ERROR(store_.Write(step, EncodeCheckpoint(state)));
  return store_.PathFor(step);
}

}  // namespace ddp
