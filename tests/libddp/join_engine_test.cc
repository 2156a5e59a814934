// ddp::Join where only the engine can put it: a joined rank whose model has no reducer
// (a live recovery drops it, DataParallel::Impl::DropReducer, before the group
// reconnects) must throw a ddp::Error naming that, not dereference null, when it has to
// shadow the others' gradient all-reduce. Two ranks, as two threads of this process
// over Gloo on loopback; links the library's objects (ddp_api) and the engine, as
// ddp-trainer does.
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libddp/src/api_bridge.h"
#include "tests/common/ports.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

// Two ranks as threads of one process would race inside PyTorch 2.x's per-process flight
// recorder on their groups' first collectives (tests/libddp/cuda_test.cc says how): off.
[[maybe_unused]] const int kFlightRecorderOff = setenv("TORCH_FR_BUFFER_SIZE", "0", 1);

TEST(JoinEngineTest, AJoinedRankWhoseModelHasNoReducerNamesIt) {
  std::string error0, error1;
  ErrorCode code0 = ErrorCode::kInternal;
  int port = 0;
  auto run = [&](int rank) {
    Environment env;
    env.rank = env.local_rank = rank;
    env.world_size = env.local_world_size = 2;
    env.master_addr = "127.0.0.1";
    env.master_port = port;
    env.node = "test";
    ProcessGroupOptions options;
    options.backend = "gloo";
    options.device = "cpu";
    options.intra_node_comm = "gloo";
    options.collective_timeout = std::chrono::seconds(10);
    options.rdzv_timeout = std::chrono::seconds(30);
    try {
      auto group = ProcessGroup::create(env, options);
      torch::nn::Linear net(2, 2);
      DistributedDataParallel model(net, group);
      if (rank == 0) {
        model.core().impl().DropReducer();  // As a live recovery does, then no rebuild.
        join({joinable(model)}, [] {});     // Out of data at once: shadows rank 1's step.
      } else {
        join({joinable(model)}, [&] { model(torch::ones({1, 2})).sum().backward(); });
      }
    } catch (const Error& e) {
      (rank == 0 ? error0 : error1) = e.what();
      if (rank == 0) code0 = e.code();
    } catch (const std::exception& e) {
      (rank == 0 ? error0 : error1) = e.what();
    }
  };
  // A port found free can be taken before rank 0's store binds it: rank 0 then cannot
  // host the store, and both try again on another port (3 tries in all).
  for (int attempt = 1; attempt <= 3; ++attempt) {
    port = *::ddp::testing::ClaimPort();
    error0.clear();
    error1.clear();
    std::thread other(run, 1);
    run(0);
    other.join();
    if (error0.find("cannot host the rendezvous store") == std::string::npos) break;
  }
  EXPECT_EQ(code0, ErrorCode::kFailedPrecondition) << error0;
  EXPECT_THAT(error0, HasSubstr("its model has no reducer"));
  EXPECT_THAT(error0, HasSubstr("Let the recovery finish"));
  // Rank 1's gradient all-reduce had no partner: it fails too, rather than hanging.
  EXPECT_FALSE(error1.empty());
}

}  // namespace
}  // namespace ddp
