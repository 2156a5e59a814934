#include "worker/trainer/comm.h"

#include <torch/cuda.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if DDP_WITH_CUDA
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace ddp {
namespace {

std::string FirstLine(const std::exception& e) {
  std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

bool IsLoopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || absl::StartsWith(addr, "127.");
}

std::shared_ptr<::gloo::transport::Device> GlooDevice(const TorchrunEnv& env) {
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
absl::Status RendezvousBarrier(c10d::Store& store, const TorchrunEnv& env,
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

}  // namespace

absl::StatusOr<DeviceChoice> ChooseDevice(const JobSpec& spec, const TorchrunEnv& env) {
  const bool cuda = torch::cuda::is_available();
  DeviceChoice choice;
  if (spec.backend == Backend::kGloo || (spec.backend == Backend::kAuto && !cuda)) {
    choice.backend = "gloo";
    return choice;
  }
#if DDP_WITH_CUDA
  if (!cuda) {
    return absl::FailedPreconditionError(
        "backend: nccl needs a CUDA GPU, and none is visible to this rank");
  }
  const int gpus = static_cast<int>(torch::cuda::device_count());
  choice.device = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank % gpus));
  choice.backend = "nccl";
  return choice;
#else
  return absl::FailedPreconditionError(
      "backend: nccl needs ddp-trainer built against a CUDA LibTorch (this build is CPU-only; "
      "see README, GPU build)");
#endif
}

absl::StatusOr<Comm> Comm::Connect(const TorchrunEnv& env, const DeviceChoice& device,
                                   std::chrono::milliseconds rdzv_timeout,
                                   std::chrono::milliseconds collective_timeout) {
  Comm c;
  c.rank_ = env.rank;
  c.world_size_ = env.world_size;
  c.device_ = device.device;
  c.timeout_ = collective_timeout;
  try {
    c10d::TCPStoreOptions opts;
    opts.port = static_cast<uint16_t>(env.master_port);
    opts.isServer = env.rank == 0;
    opts.numWorkers = static_cast<size_t>(env.world_size);
    opts.waitWorkers = false;  // Our own barrier below says who is missing.
    opts.timeout = rdzv_timeout;
    auto tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
    // Every key of this job's attempt, ours and the process group's, lives under one
    // prefix (as torchrun scopes its store per restart).
    c.store_ = c10::make_intrusive<c10d::PrefixStore>(
        absl::StrCat("ddp/", env.job_id, "/", env.attempt), tcp);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(
        env.rank == 0 ? "cannot host" : "cannot reach", " the rendezvous store at ",
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
  return c;
}

absl::Status Comm::Run(const char* what,
                       const std::function<c10::intrusive_ptr<c10d::Work>()>& op) {
  try {
    op()->wait(timeout_);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat(what, " failed (a peer died or hung past "
                                                     "train.collective_timeout_s): ",
                                               FirstLine(e)));
  }
  return absl::OkStatus();
}

absl::Status Comm::Broadcast(const std::vector<at::Tensor>& tensors) {
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
    c10d::BroadcastOptions opts;
    opts.rootRank = 0;
    opts.timeout = timeout_;
    absl::Status st = Run("broadcast", [&] { return backend_->broadcast(buf, opts); });
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

absl::Status Comm::AllReduceSum(at::Tensor& tensor) {
  std::vector<at::Tensor> tensors = {tensor};
  c10d::AllreduceOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  opts.timeout = timeout_;
  return Run("all-reduce", [&] { return backend_->allreduce(tensors, opts); });
}

absl::Status Comm::Barrier() {
  c10d::BarrierOptions opts;
  opts.timeout = timeout_;
  return Run("barrier", [&] { return backend_->barrier(opts); });
}

}  // namespace ddp
