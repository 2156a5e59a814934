// ddp-bench-allreduce: all-reduce latency of ddp-trainer's comm layer, shared memory
// or Gloo, from 4 KB to 64 MB (bench/suite.py starts one per rank).
//
//   RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. ddp-bench-allreduce --intra-node shm
//
// Each size: 3 warm-up sums, then back-to-back float32 sums (StartSum + Wait, as the
// reducer issues them), each timed on its own. Rank 0 prints one JSON line per size:
// {bytes, iters, median_us, p10_us, p90_us}.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <vector>

#include "common/flags.h"
#include "libddp/engine/comm.h"
#include "libddp/engine/environment.h"

namespace {

int Fail(const absl::Status& st) {
  std::cerr << "ddp-bench-allreduce: " << st.message() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "shm";
  int budget_ms = 300;  // Per size, after warm-up.
  ddp::FlagSet flags("ddp-bench-allreduce", "All-reduce latency, shared memory or Gloo.");
  flags.String("intra-node", &mode, "shm or gloo");
  flags.Int("budget-ms", &budget_ms, "time spent per size (at least 5 sums each)");
  auto rest = flags.Parse(argc, argv);
  if (!rest.ok()) return Fail(rest.status());
  auto env = ddp::ReadEnvironment();
  if (!env.ok()) return Fail(env.status());
  ddp::CommOptions options;
  options.intra_node = mode == "shm" ? ddp::CommOptions::IntraNode::kShm
                                      : ddp::CommOptions::IntraNode::kGloo;
  ddp::DeviceChoice device;
  device.backend = "gloo";
  auto comm = ddp::Comm::Connect(*env, device, options);
  if (!comm.ok()) return Fail(comm.status());
  if (comm->intra_node_comm() != mode) {
    return Fail(absl::FailedPreconditionError("asked for " + mode + ", got " +
                                              comm->intra_node_comm()));
  }
  const std::vector<int64_t> sizes = {4 << 10,   16 << 10, 64 << 10, 256 << 10, 340 << 10,
                                      1 << 20,   4 << 20,  16 << 20, 64 << 20};
  for (int64_t bytes : sizes) {
    at::Tensor t = at::ones({bytes / 4}, at::kFloat);
    auto once = [&]() -> absl::StatusOr<double> {
      const auto t0 = std::chrono::steady_clock::now();
      absl::Status st = comm->StartSum(t)->Wait();
      if (!st.ok()) return st;
      return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
          .count();
    };
    if (absl::Status st = comm->Barrier(); !st.ok()) return Fail(st);
    for (int i = 0; i < 3; ++i) {
      if (auto r = once(); !r.ok()) return Fail(r.status());
    }
    // Every rank runs the same number of sums: rank 0's estimate, broadcast.
    auto first = once();
    if (!first.ok()) return Fail(first.status());
    at::Tensor iters = at::full({1}, std::max(5.0, budget_ms * 1000.0 / *first), at::kDouble);
    if (absl::Status st = comm->Broadcast({iters}); !st.ok()) return Fail(st);
    std::vector<double> us;
    for (int i = 0; i < static_cast<int>(iters.item<double>()); ++i) {
      auto r = once();
      if (!r.ok()) return Fail(r.status());
      us.push_back(*r);
    }
    std::sort(us.begin(), us.end());
    if (env->rank == 0) {
      std::printf("{\"bytes\":%lld,\"iters\":%zu,\"median_us\":%.2f,\"p10_us\":%.2f,"
                  "\"p90_us\":%.2f}\n",
                  static_cast<long long>(bytes), us.size(), us[us.size() / 2],
                  us[us.size() / 10], us[us.size() * 9 / 10]);
      std::fflush(stdout);
    }
  }
  return comm->Barrier().ok() ? 0 : 1;
}
