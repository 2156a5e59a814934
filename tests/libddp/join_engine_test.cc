// ddp::Join where only the engine can put it: a joined rank whose model has no reducer
// (a live recovery drops it, DataParallel::Impl::DropReducer, before the group
// reconnects) must throw a ddp::Error naming that, not dereference null, when it has to
// shadow the others' gradient all-reduce. Two ranks, as two threads of this process
// over Gloo on loopback; links the library's objects (ddp_api) and the engine, as
// ddp-trainer does.
#include <ddp/ddp.h>
#include <torch/torch.h>

#include <chrono>
#include <string>
#include <thread>

#include "common/net.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "libddp/engine/api_bridge.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

TEST(JoinEngineTest, AJoinedRankWhoseModelHasNoReducerNamesIt) {
  const int port = *PickFreePort();
  std::string error0, error1;
  ErrorCode code0 = ErrorCode::kInternal;
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
    auto group = ProcessGroup::create(env, options);
    torch::nn::Linear net(2, 2);
    DistributedDataParallel model(net, group);
    try {
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
  std::thread other(run, 1);
  run(0);
  other.join();
  EXPECT_EQ(code0, ErrorCode::kFailedPrecondition) << error0;
  EXPECT_THAT(error0, HasSubstr("its model has no reducer"));
  EXPECT_THAT(error0, HasSubstr("Let the recovery finish"));
  // Rank 1's gradient all-reduce had no partner: it fails too, rather than hanging.
  EXPECT_FALSE(error1.empty());
}

}  // namespace
}  // namespace ddp
