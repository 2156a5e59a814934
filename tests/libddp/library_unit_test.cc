// libddp's public API, call by call, in one process: the sampler against PyTorch's
// fixture grid and as a torch::data sampler, the lr scheduler against the closed forms,
// the reporter's lines against the agent's parser, and the errors bad input gets.
#include <ddp/ddp.h>
#include <fcntl.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/ports.h"
#include "tests/common/test_util.h"
#include "tests/trainer/trainer_harness.h"
#include "worker/agent/trainer_event_parser.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

TEST(DistributedSamplerTest, MatchesPyTorchOverTheFixtureGrid) {
  std::ifstream in(testing::SourceDir() + "/tests/fixtures/sampler_grid.txt");
  ASSERT_TRUE(in);
  std::string line;
  int cases = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t colon = line.find(" : ");
    ASSERT_NE(colon, std::string::npos) << line;
    std::istringstream head(line.substr(0, colon)), tail(line.substr(colon + 3));
    int64_t n, world, rank, seed, epoch, shuffle, drop_last;
    ASSERT_TRUE(head >> n >> world >> rank >> seed >> epoch >> shuffle >> drop_last) << line;
    std::vector<int64_t> expected;
    for (int64_t v; tail >> v;) expected.push_back(v);
    DistributedSampler sampler(n, world, rank, shuffle != 0, seed, drop_last != 0);
    sampler.set_epoch(epoch);
    EXPECT_EQ(sampler.indices(), expected) << "case: " << line.substr(0, colon);
    EXPECT_EQ(sampler.size(), static_cast<int64_t>(expected.size()));
    ++cases;
  }
  EXPECT_GT(cases, 1000);
}

TEST(DistributedSamplerTest, FeedsATorchDataLoaderInItsOrder) {
  // Targets equal to the sample index show which samples each batch holds.
  const int64_t n = 23;
  auto dataset = torch::data::datasets::TensorDataset(torch::arange(n).unsqueeze(1))
                     .map(torch::data::transforms::Stack<torch::data::TensorExample>());
  DistributedSampler sampler(n, /*num_replicas=*/3, /*rank=*/1, /*shuffle=*/true, /*seed=*/7);
  auto loader = torch::data::make_data_loader(std::move(dataset), sampler,
                                              torch::data::DataLoaderOptions().batch_size(4));
  std::vector<int64_t> first_pass;
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    sampler.set_epoch(epoch);  // Reaches the loader's copy.
    std::vector<int64_t> seen;
    for (auto& batch : *loader) {
      for (int64_t i = 0; i < batch.data.size(0); ++i) seen.push_back(batch.data[i][0].item<int64_t>());
    }
    EXPECT_EQ(seen, sampler.indices()) << "epoch " << epoch;
    EXPECT_EQ(static_cast<int64_t>(seen.size()), sampler.size());
    if (epoch == 0) {
      first_pass = seen;
    } else {
      EXPECT_NE(seen, first_pass) << "epoch " << epoch << " reshuffles";
    }
  }
}

TEST(DistributedSamplerTest, NextHandsOutBatchesUntilTheEpochEnds) {
  DistributedSampler sampler(10, 2, 0, /*shuffle=*/false);
  std::vector<size_t> all;
  while (auto batch = sampler.next(3)) all.insert(all.end(), batch->begin(), batch->end());
  EXPECT_EQ(all, (std::vector<size_t>{0, 2, 4, 6, 8}));
  sampler.reset();
  EXPECT_EQ(sampler.next(2)->size(), 2u);
}

// Decision 191: 3 ranks trained 4 batches of 8 (96 of 200 samples); 2 ranks go on with
// the rest of the epoch, and the epoch sees each sample once.
TEST(DistributedSamplerTest, AnotherWorldGoesOnWithTheRestOfTheEpoch) {
  const int64_t n = 200;
  std::vector<int64_t> seen;
  int64_t done = 0;
  for (int64_t rank = 0; rank < 3; ++rank) {
    DistributedSampler s(n, 3, rank, /*shuffle=*/true, /*seed=*/3);
    s.set_epoch(4);
    std::vector<int64_t> mine = s.indices();
    seen.insert(seen.end(), mine.begin(), mine.begin() + 4 * 8);
    done = s.samples_done_after(4, 8);
  }
  EXPECT_EQ(done, 96);
  for (int64_t rank = 0; rank < 2; ++rank) {
    DistributedSampler s(n, 2, rank, /*shuffle=*/true, /*seed=*/3);
    s.set_epoch(4, done);
    EXPECT_EQ(s.size(), 52);
    DistributedSampler copy = s;  // A loader's copy goes on from there too.
    copy.reset();
    while (auto batch = copy.next(8)) seen.insert(seen.end(), batch->begin(), batch->end());
    EXPECT_EQ(s.samples_done_after(52 / 8, 8), 96 + 6 * 8 * 2);
    s.set_epoch(5);
    EXPECT_EQ(s.samples_done(), 0) << "a new epoch starts at its first sample";
    EXPECT_EQ(s.size(), 100);
  }
  std::sort(seen.begin(), seen.end());
  std::vector<int64_t> every(n);
  std::iota(every.begin(), every.end(), 0);
  EXPECT_EQ(seen, every);
  DistributedSampler s(n, 2, 0);
  try {
    s.set_epoch(1, n + 1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("samples_done 201 is not in [0, 200]"));
  }
}

TEST(DistributedSamplerTest, RankOutsideTheWorldIsAnError) {
  try {
    DistributedSampler(10, 2, 2);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("rank 2 is not in [0, 2)"));
    EXPECT_EQ(e.exit_code(), 2);
  }
}

TEST(LrSchedulerTest, SetsEveryGroupFromTheClosedForm) {
  auto a = torch::zeros({2}, torch::requires_grad());
  torch::optim::SGD opt({a}, torch::optim::SGDOptions(0.2));
  LrSchedule s;
  s.kind = LrSchedule::Kind::kCosine;
  s.warmup = 3;
  s.eta_min = 0.01;
  LrScheduler sched(opt, s, /*total=*/10);
  EXPECT_DOUBLE_EQ(sched.lr(), 0.2 * 0.1);  // Warm-up starts at warmup_start_factor.
  for (int64_t k = 1; k <= 10; ++k) {
    sched.step();
    EXPECT_DOUBLE_EQ(sched.lr(), scheduled_lr(s, 0.2, k, 10)) << "after " << k << " steps";
  }
  EXPECT_DOUBLE_EQ(scheduled_lr(s, 0.2, 3, 10), 0.2);  // Warm-up done: the base lr.
  sched.set_count(5);
  EXPECT_DOUBLE_EQ(sched.lr(), scheduled_lr(s, 0.2, 5, 10));
  EXPECT_EQ(sched.count(), 5);
}

TEST(ClipGradNormTest, ScalesToTheMaxNormAndReturnsTheTotal) {
  auto p = torch::zeros({2}, torch::requires_grad());
  p.mutable_grad() = torch::tensor({3.0f, 4.0f});
  EXPECT_NEAR(clip_grad_norm({p}, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(p.grad().norm().item<double>(), 1.0, 1e-5);
}

// The reporter's lines are what the worker's lenient parser takes from a program.
TEST(FingerprintTest, IsFnv1aOverTheTensorsBytesInOrder) {
  // FNV-1a 64's published values: the empty input, and "a".
  EXPECT_EQ(ddp::fingerprint({}), "cbf29ce484222325");
  EXPECT_EQ(ddp::fingerprint({torch::full({1}, 97, torch::kUInt8)}), "af63dc4c8601ec8c");
  const torch::Tensor m = torch::arange(12, torch::kFloat).reshape({3, 4});
  const torch::Tensor v = torch::randn({5}, torch::kDouble);
  // Bytes in order: a transposed view hashes as its contiguous copy, two tensors as
  // their bytes one after the other; any other byte or order differs.
  EXPECT_EQ(ddp::fingerprint({m.t()}), ddp::fingerprint({m.t().contiguous()}));
  EXPECT_NE(ddp::fingerprint({m.t()}), ddp::fingerprint({m}));
  EXPECT_EQ(ddp::fingerprint({m, v}),
            ddp::fingerprint({torch::cat({m.reshape({-1}).view(torch::kUInt8),
                                          v.view(torch::kUInt8)})}));
  EXPECT_NE(ddp::fingerprint({m, v}), ddp::fingerprint({v, m}));
  torch::Tensor w = m.clone();
  w[2][3] = std::nextafter(11.0f, 12.0f);
  EXPECT_NE(ddp::fingerprint({w}), ddp::fingerprint({m}));
  EXPECT_EQ(ddp::fingerprint({m}).size(), 16u);
}

TEST(ReporterTest, WritesLinesTheAgentAccepts) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  {
    Reporter report(fds[1]);
    StepReport s;
    s.loss = 0.25;
    s.epoch = 1;
    s.step = 2;
    s.steps = 10;
    s.lr = 0.1;
    s.gpu_memory_allocated_mib = 512;
    s.gpu_memory_peak_mib = 700;
    report.step(s);
    EpochReport e;
    e.epoch = 1;
    e.val_accuracy = 0.5;
    report.epoch(e);
    report.checkpoint("/tmp/ckpt", 2, 0, 20);
    report.error("peer lost", /*retryable=*/true);
    report.done(2, 20);
    StepReport no_loss;  // A step without a loss is not sent.
    report.step(no_loss);
  }
  ::close(fds[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) text.append(buf, n);
  ::close(fds[0]);
  std::istringstream lines(text);
  std::vector<std::string> types;
  for (std::string line; std::getline(lines, line);) {
    v1::TrainerEvent event;
    std::string why;
    EXPECT_EQ(ParseProgramEvent(line, 3, 0.0, &event, &why), ProgramLine::kEvent)
        << line << ": " << why;
    EXPECT_EQ(event.rank(), 3);
    types.push_back(EventTypeName(event));
    if (event.has_step()) {
      EXPECT_DOUBLE_EQ(event.step().loss(), 0.25);
      EXPECT_EQ(event.step().steps(), 10);
      EXPECT_THAT(line, ::testing::Not(HasSubstr("samples_per_s")));  // Unset: not sent.
      EXPECT_DOUBLE_EQ(event.step().gpu_memory_allocated_mib(), 512);
      EXPECT_DOUBLE_EQ(event.step().gpu_memory_peak_mib(), 700);
      EXPECT_FALSE(event.step().has_gpu_memory_reserved_mib());
    }
  }
  EXPECT_EQ(types, (std::vector<std::string>{"step", "epoch", "checkpoint", "error", "done"}));
}

TEST(GpuMemoryTest, UnsetWithoutAGpu) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "a GPU is visible: libddp_cuda_test covers it";
  const GpuMemory m = gpu_memory();
  EXPECT_TRUE(std::isnan(m.allocated_mib));
  EXPECT_TRUE(std::isnan(m.reserved_mib));
  EXPECT_TRUE(std::isnan(m.peak_mib));
}

// ddp::Autocast is torch.autocast: inside, a matmul of fp32 tensors runs in bf16;
// nesting restores the enclosing state; after it, everything is fp32 again, and the
// parameters and their gradients stayed fp32 (the "master weights").
TEST(AutocastTest, ScopesBf16AsTorchAutocastDoes) {
  const torch::Tensor a = torch::ones({4, 4});
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat);
  {
    Autocast outer(torch::kCPU);
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
    {
      Autocast inner(torch::kCPU);
      EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);
    }
    EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kBFloat16);  // Still the outer's.
  }
  EXPECT_EQ(torch::mm(a, a).scalar_type(), torch::kFloat);
  torch::nn::Linear layer(4, 2);
  torch::Tensor out;
  {
    Autocast autocast(torch::kCPU);
    out = layer(a);
  }
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  out.sum().backward();
  EXPECT_EQ(layer->weight.scalar_type(), torch::kFloat);
  EXPECT_EQ(layer->weight.grad().scalar_type(), torch::kFloat);
}

TEST(AutocastTest, WhatItCannotDoIsNamed) {
  EXPECT_THAT([] { Autocast a(torch::kCPU, torch::kHalf); },
              ::testing::ThrowsMessage<Error>(HasSubstr("float16 on the CPU is not offered")));
  EXPECT_THAT([] { Autocast a(torch::kCPU, torch::kDouble); },
              ::testing::ThrowsMessage<Error>(HasSubstr("is not a lower precision")));
  EXPECT_THAT([] { Autocast a(torch::Device("meta")); },
              ::testing::ThrowsMessage<Error>(HasSubstr("is neither the CPU nor a CUDA GPU")));
  EXPECT_EQ(torch::mm(torch::ones({2, 2}), torch::ones({2, 2})).scalar_type(), torch::kFloat);
}

TEST(ReporterTest, AClosedReaderStopsReportingWithoutKillingTheProgram) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  ::close(fds[0]);
  Reporter report(fds[1]);
  StepReport s;
  s.loss = 1.0;
  report.step(s);  // EPIPE (SIGPIPE blocked and swallowed): reporting stops.
  EXPECT_FALSE(report.enabled());
  ::close(fds[1]);
}

TEST(ReporterTest, WithoutEventsFdNothingIsWritten) {
  ::unsetenv("DDP_EVENTS_FD");
  ::unsetenv("DDP_REPORT_STDOUT");
  EXPECT_FALSE(Reporter().enabled());
}

TEST(EnvironmentTest, ErrorsNameTheVariable) {
  ::setenv("RANK", "0", 1);
  ::setenv("WORLD_SIZE", "x", 1);
  ::setenv("MASTER_ADDR", "127.0.0.1", 1);
  ::setenv("MASTER_PORT", "29500", 1);
  try {
    read_environment();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("WORLD_SIZE"));
    EXPECT_FALSE(e.retryable());
  }
  ::setenv("WORLD_SIZE", "1", 1);
  EXPECT_EQ(read_environment().world_size, 1);
}

// A world of one: a real TCPStore and Gloo group on a free loopback port.
std::shared_ptr<ProcessGroup> WorldOfOne() {
  Environment env;
  env.master_addr = "127.0.0.1";
  env.master_port = *::ddp::testing::ClaimPort();
  env.node = "test";
  return ProcessGroup::create(env);
}

TEST(ProcessGroupTest, BadOptionsAreNamed) {
  Environment env;
  env.master_addr = "127.0.0.1";
  env.master_port = 1;
  ProcessGroupOptions o;
  o.backend = "mpi";
  try {
    ProcessGroup::create(env, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("'mpi' is not one of auto, gloo, nccl"));
  }
}

TEST(ProcessGroupTest, ADeviceThatCannotBeHadIsNamed) {
  Environment env;
  env.master_addr = "127.0.0.1";
  env.master_port = 1;  // Never reached: every case fails before the rendezvous.
  ProcessGroupOptions o;
  o.device = "tpu";
  try {
    ProcessGroup::create(env, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("'tpu' is not one of auto, cpu, cuda"));
  }
  o.device = "cpu";
  o.backend = "nccl";
  try {
    ProcessGroup::create(env, o);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_THAT(e.what(), HasSubstr("NCCL reduces GPU tensors only"));
  }
  if (torch::cuda::is_available()) GTEST_SKIP() << "a GPU is visible: tests/libddp/cuda_test.cc";
  for (const char* backend : {"gloo", "nccl", "auto"}) {
    o.device = "cuda";
    o.backend = backend;
    try {
      ProcessGroup::create(env, o);
      FAIL() << "no error for " << backend;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kFailedPrecondition) << backend;
      EXPECT_THAT(e.what(), HasSubstr("on device cuda needs")) << backend;
    }
  }
}

TEST(ProcessGroupTest, AWorldOfOneSumsAndBroadcasts) {
  auto group = WorldOfOne();
  EXPECT_EQ(group->world_size(), 1);
  EXPECT_EQ(group->backend(), "gloo");
  EXPECT_EQ(group->sum({1.5, 2.0}), (std::vector<double>{1.5, 2.0}));
  group->barrier();
}

TEST(DistributedDataParallelTest, AModelWithNothingToTrainIsRefused) {
  auto group = WorldOfOne();
  torch::nn::Linear frozen(2, 2);
  for (auto& p : frozen->parameters()) p.set_requires_grad(false);
  try {
    DistributedDataParallel model(frozen, group);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("no parameter requires grad"));
  }
}

// As PyTorch's DDP without find_unused_parameters: the backward leaves the unused
// parameter's gradient undefined and the next forward fails, naming it
// (ddp_graph_parity_test compares with PyTorch on 2 and 3 ranks).
TEST(DistributedDataParallelTest, NoSyncIsScopedAndUnusedParametersFailTheNextForward) {
  auto group = WorldOfOne();
  struct TwoHeadsImpl : torch::nn::Module {
    TwoHeadsImpl() : used(register_module("used", torch::nn::Linear(3, 1))),
                     unused(register_module("unused", torch::nn::Linear(3, 1))) {}
    torch::Tensor forward(const torch::Tensor& x) { return used(x); }
    torch::nn::Linear used, unused;
  };
  auto net = std::make_shared<TwoHeadsImpl>();
  DistributedDataParallel model(net, group);
  EXPECT_TRUE(model.core().require_backward_grad_sync());
  {
    auto guard = model.no_sync();
    EXPECT_FALSE(model.core().require_backward_grad_sync());
  }
  EXPECT_TRUE(model.core().require_backward_grad_sync());
  model(torch::ones({4, 3})).sum().backward();
  EXPECT_TRUE(net->used->weight.grad().defined());
  EXPECT_FALSE(net->unused->weight.grad().defined());
  EXPECT_EQ(model.core().buckets().size(), 1u);
  EXPECT_EQ(model.core().buckets()[0].params, 4);
  try {
    model(torch::ones({4, 3}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("Expected to have finished reduction in the prior iteration"));
    EXPECT_THAT(e.what(), HasSubstr("DdpOptions::find_unused_parameters"));
    EXPECT_THAT(e.what(), HasSubstr("for rank 0: 2 3"));
    EXPECT_THAT(e.what(), HasSubstr("unused.weight, unused.bias"));
  }
  {  // A forward without grad (evaluation) is fine, as in PyTorch.
    torch::NoGradGuard no_grad;
    EXPECT_EQ(model(torch::ones({4, 3})).size(0), 4);
  }
}

TEST(DistributedDataParallelTest, FindUnusedParametersLeavesUnusedGradientsUndefined) {
  auto group = WorldOfOne();
  struct TwoHeadsImpl : torch::nn::Module {
    TwoHeadsImpl() : used(register_module("used", torch::nn::Linear(3, 1))),
                     unused(register_module("unused", torch::nn::Linear(3, 1))) {}
    std::tuple<torch::Tensor, torch::Tensor> forward(const torch::Tensor& x) {
      return {used(x), x * 2};
    }
    torch::nn::Linear used, unused;
  };
  auto net = std::make_shared<TwoHeadsImpl>();
  DdpOptions options;
  options.find_unused_parameters = true;
  DistributedDataParallel model(net, group, options);
  for (int step = 0; step < 2; ++step) {
    std::get<0>(model(torch::ones({4, 3}))).sum().backward();
    EXPECT_TRUE(net->used->weight.grad().defined());
    EXPECT_FALSE(net->unused->weight.grad().defined());
  }
}

TEST(CheckpointerTest, AnEmptyDirIsRefused) {
  auto group = WorldOfOne();
  try {
    Checkpointer ckpt(group, CheckpointOptions{});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("CheckpointOptions.dir"));
  }
}

// CheckpointOptions.async: save() returns with the state copied; what is written is the
// state at save(), whatever training changes meanwhile.
TEST(CheckpointerTest, AnAsyncSaveWritesTheStateOfItsCallInTheBackground) {
  auto group = WorldOfOne();
  const std::string dir = ::ddp::testing::MakeTempDir("async-ckpt");
  torch::manual_seed(3);
  torch::nn::Linear net(64, 32);
  torch::optim::Adam opt(net->parameters(), torch::optim::AdamOptions(0.1));
  net(torch::ones({2, 64})).sum().backward();
  opt.step();
  const torch::Tensor saved = net->weight.detach().clone();
  std::string path;
  {
    Checkpointer ckpt(group, CheckpointOptions{dir, 2, true, false, /*async=*/true});
    path = ckpt.save(*net, opt, Position{0, 1, 1});
    EXPECT_EQ(path, dir + "/checkpoint-0000000001.pt");
    {
      torch::NoGradGuard no_grad;
      net->weight.add_(1.0);  // Training goes on while the file is written.
    }
    ckpt.wait();
    std::ifstream file(path);
    EXPECT_TRUE(file.good()) << path << " is on disk after wait()";
  }
  torch::nn::Linear fresh(64, 32);
  torch::optim::Adam fresh_opt(fresh->parameters(), torch::optim::AdamOptions(0.1));
  Checkpointer reader(group, CheckpointOptions{dir});
  std::optional<Position> pos = reader.load(*fresh, fresh_opt);
  ASSERT_TRUE(pos.has_value());
  EXPECT_EQ(pos->global_step, 1);
  EXPECT_TRUE(torch::equal(fresh->weight, saved)) << "the state of save(), not the one after";
}

TEST(VersionTest, TheLibraryIsTheHeadersVersion) {
  EXPECT_STREQ(version(), DDP_VERSION_STRING);
}

}  // namespace
}  // namespace ddp
