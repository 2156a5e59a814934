// libFuzzer target: the coordinator's request handling in-process. Each input is a
// sequence of operations decoded from the bytes: SubmitJob, Register, Heartbeat,
// ReportEvents, CancelJob, GetJob, ListJobs, ListWorkers and clock ticks, with
// requests built field by field (names drawn from a small set so that operations
// meet each other) or parsed from raw bytes as protobuf messages. Everything runs
// against a real SQLite store and event hub with a fake clock. No input may crash the
// coordinator or trip a sanitizer.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "common/clock.h"
#include "coordinator/core/coordinator.h"
#include "coordinator/core/event_hub.h"
#include "coordinator/store/state_store.h"
#include "ddp/v1/job_service.pb.h"
#include "ddp/v1/worker_service.pb.h"

namespace {

const char* const kSpecs[] = {
    "name: a\nnodes: 2\nmodel: {mlp: {hidden: [8]}}\n"
    "data: {synthetic: {samples: 64, features: 4, classes: 2}}\ntrain: {batch_size: 8}\n",
    "name: b\nnodes: \"1:3\"\nmax_restarts: 2\nmodel: {mlp: {}}\n"
    "data: {synthetic: {}}\ntrain: {batch_size: 4, epochs: 3}\nrdzv: {last_call_s: 1}\n",
    "name: c\nrdzv_id: shared\nnproc_per_node: 2\nmodel: {mlp: {hidden: [4]}}\n"
    "data: {synthetic: {}}\ntrain: {batch_size: 2}\ncheckpoint: {dir: ck/{job_id}}\n",
};
const char* const kWorkers[] = {"w0", "w1", "w2"};
const char* const kIncarnations[] = {"i0", "i1"};

// The coordinator and what it stands on, rebuilt now and then so that the store does
// not grow without bound over a long run.
struct World {
  explicit World(const std::string& dir) : clock(absl::FromUnixSeconds(1700000000)) {
    store = *ddp::StateStore::Open(dir, ddp::RetentionOptions{1000, 1000, 50});
    hub = std::make_unique<ddp::EventHub>(store.get(), &clock, ddp::EventHub::Options{});
    coordinator = std::make_unique<ddp::Coordinator>(ddp::CoordinatorOptions{}, store.get(),
                                                     hub.get(), &clock);
    (void)coordinator->Recover();
  }
  ddp::FakeClock clock;
  std::unique_ptr<ddp::StateStore> store;
  std::unique_ptr<ddp::EventHub> hub;
  std::unique_ptr<ddp::Coordinator> coordinator;
  std::vector<std::string> jobs;
};

std::string Pick(FuzzedDataProvider& p, const char* const* names, size_t n,
                 const std::vector<std::string>* more = nullptr) {
  const size_t extra = more ? more->size() : 0;
  const size_t i = p.ConsumeIntegralInRange<size_t>(0, n + extra);
  if (i < n) return names[i];
  if (i < n + extra) return (*more)[i - n];
  return p.ConsumeRandomLengthString(16);
}

template <typename Message>
Message Raw(FuzzedDataProvider& p) {
  Message m;
  (void)m.ParseFromString(p.ConsumeRandomLengthString(512));
  return m;
}

void RunOne(World& w, FuzzedDataProvider& p) {
  ddp::Coordinator& c = *w.coordinator;
  switch (p.ConsumeIntegralInRange(0, 11)) {
    case 0: {
      ddp::v1::SubmitJobRequest r;
      std::string spec = kSpecs[p.ConsumeIntegralInRange<size_t>(0, 2)];
      if (p.ConsumeBool()) spec += p.ConsumeRandomLengthString(64);
      r.set_spec_yaml(spec);
      r.set_workdir("/tmp");
      auto job = c.Submit(r);
      if (job.ok()) w.jobs.push_back(job->id());
      break;
    }
    case 1: {
      ddp::v1::RegisterRequest r;
      r.set_worker(Pick(p, kWorkers, 3));
      r.set_incarnation(Pick(p, kIncarnations, 2));
      r.set_address(p.ConsumeRandomLengthString(16));
      r.set_slots(p.ConsumeIntegralInRange<int32_t>(-1, 4));
      r.set_gpus(p.ConsumeIntegral<int32_t>());
      (void)c.Register(r);
      break;
    }
    case 2: {
      ddp::v1::HeartbeatRequest r;
      r.set_worker(Pick(p, kWorkers, 3));
      r.set_incarnation(Pick(p, kIncarnations, 2));
      const int tasks = p.ConsumeIntegralInRange(0, 3);
      for (int t = 0; t < tasks; ++t) {
        ddp::v1::TaskStatus* s = r.add_tasks();
        s->set_job_id(Pick(p, nullptr, 0, &w.jobs));
        s->set_attempt(p.ConsumeIntegralInRange<int32_t>(-1, 4));
        if (p.ConsumeBool()) s->set_error(p.ConsumeRandomLengthString(32));
        const int ranks = p.ConsumeIntegralInRange(0, 3);
        for (int k = 0; k < ranks; ++k) {
          ddp::v1::LocalRankStatus* rs = s->add_ranks();
          rs->set_rank(p.ConsumeIntegralInRange<int32_t>(-1, 8));
          rs->set_pid(p.ConsumeIntegral<int32_t>());
          rs->set_exited(p.ConsumeBool());
          rs->set_exit_code(p.ConsumeIntegralInRange<int32_t>(-1, 3));
          rs->set_signal(p.ConsumeIntegralInRange<int32_t>(0, 15));
        }
      }
      const int ports = p.ConsumeIntegralInRange(0, 4);
      for (int k = 0; k < ports; ++k) r.add_free_ports(p.ConsumeIntegral<int32_t>());
      (void)c.Heartbeat(r);
      break;
    }
    case 3: {
      ddp::v1::ReportEventsRequest r;
      r.set_worker(Pick(p, kWorkers, 3));
      r.set_incarnation(Pick(p, kIncarnations, 2));
      r.set_batch_seq(p.ConsumeIntegralInRange<int64_t>(-1, 5));
      r.set_dropped(p.ConsumeIntegral<int64_t>());
      const int events = p.ConsumeIntegralInRange(0, 6);
      for (int k = 0; k < events; ++k) {
        ddp::v1::ReportedEvent* e = r.add_events();
        e->set_job_id(Pick(p, nullptr, 0, &w.jobs));
        e->set_attempt(p.ConsumeIntegralInRange<int32_t>(-1, 4));
        e->set_rank(p.ConsumeIntegralInRange<int32_t>(-1, 8));
        e->set_time_ms(p.ConsumeIntegral<int64_t>());
        if (p.ConsumeBool()) {
          // Every body the oneof has, and none (an older agent's flat event).
          ddp::v1::TrainerEvent* ev = e->mutable_event();
          const int64_t epoch = p.ConsumeIntegral<int64_t>();
          const int64_t step = p.ConsumeIntegral<int64_t>();
          switch (p.ConsumeIntegralInRange(0, 6)) {
            case 0: ev->mutable_start()->set_world_size(p.ConsumeIntegral<int32_t>()); break;
            case 1:
              ev->mutable_step()->set_epoch(epoch);
              ev->mutable_step()->set_step(step);
              ev->mutable_step()->set_loss(p.ConsumeFloatingPoint<double>());
              break;
            case 2:
              ev->mutable_epoch()->set_epoch(epoch);
              ev->mutable_epoch()->set_train_loss(p.ConsumeFloatingPoint<double>());
              break;
            case 3:
              ev->mutable_checkpoint()->set_epoch(epoch);
              ev->mutable_checkpoint()->set_global_step(step);
              break;
            case 4: ev->mutable_done()->set_global_step(step); break;
            case 5: ev->mutable_error()->set_message(p.ConsumeRandomLengthString(32)); break;
            default: ev->set_rank(p.ConsumeIntegral<int32_t>()); break;
          }
        } else {
          e->mutable_log()->set_text(p.ConsumeRandomLengthString(64));
          e->mutable_log()->set_stream(p.ConsumeBool() ? "stdout" : "stderr");
        }
      }
      (void)c.ReportEvents(r);
      break;
    }
    case 4:
      (void)c.Cancel(Pick(p, nullptr, 0, &w.jobs));
      break;
    case 5:
      (void)c.GetJob(Pick(p, nullptr, 0, &w.jobs), p.ConsumeBool());
      break;
    case 6:
      (void)c.ListJobs(p.ConsumeIntegralInRange(-1, 200));
      {
        ddp::v1::ListWorkersRequest r;
        r.set_limit(p.ConsumeIntegralInRange(-1, 6000));
        r.set_summary_only(p.ConsumeBool());
        r.set_page_token(p.ConsumeRandomLengthString(16));
        (void)c.ListWorkers(r);
      }
      break;
    case 7:
      w.clock.Advance(absl::Milliseconds(p.ConsumeIntegralInRange(0, 30000)));
      c.Tick();
      break;
    case 8: {  // Raw protobuf bytes, as a hostile client sends them.
      auto r = Raw<ddp::v1::SubmitJobRequest>(p);
      (void)c.Submit(r);
      break;
    }
    case 9:
      (void)c.Register(Raw<ddp::v1::RegisterRequest>(p));
      break;
    case 10:
      (void)c.Heartbeat(Raw<ddp::v1::HeartbeatRequest>(p));
      break;
    default:
      (void)c.ReportEvents(Raw<ddp::v1::ReportEventsRequest>(p));
      break;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static int runs = 0;
  static std::string dir;
  static std::unique_ptr<World> world;
  if (world == nullptr || ++runs % 200 == 0) {
    world.reset();
    if (!dir.empty()) std::filesystem::remove_all(dir);
    char templ[] = "/tmp/ddp-coordinator-fuzz-XXXXXX";
    dir = mkdtemp(templ);
    world = std::make_unique<World>(dir);
    static bool registered = false;
    if (!registered) {
      registered = true;
      std::atexit([] {
        world.reset();
        std::filesystem::remove_all(dir);
      });
    }
  }
  FuzzedDataProvider p(data, size);
  for (int ops = 0; ops < 32 && p.remaining_bytes() > 0; ++ops) RunOne(*world, p);
  return 0;
}
