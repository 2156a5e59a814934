#include "tests/trainer/trainer_harness.h"

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"
#include "tests/common/ports.h"

namespace ddp::testing {

bool Event::Has(const std::string& key) const { return fields.fields().count(key) > 0; }

double Event::Number(const std::string& key) const {
  auto it = fields.fields().find(key);
  if (it == fields.fields().end() || !it->second.has_number_value()) return std::nan("");
  return it->second.number_value();
}

std::string Event::String(const std::string& key) const {
  auto it = fields.fields().find(key);
  if (it == fields.fields().end() || !it->second.has_string_value()) return "";
  return it->second.string_value();
}

std::vector<Event> RankResult::OfType(const std::string& type) const {
  std::vector<Event> out;
  for (const Event& e : events) {
    if (e.type() == type) out.push_back(e);
  }
  return out;
}

absl::StatusOr<std::unique_ptr<TrainerGroup>> TrainerGroup::Start(const TrainerLaunch& launch) {
  auto group = std::make_unique<TrainerGroup>();
  group->port_ = launch.master_port;
  if (group->port_ == 0) {
    auto port = ::ddp::testing::ClaimPort();
    if (!port.ok()) return port.status();
    group->port_ = *port;
  }
  std::vector<int> ranks = launch.ranks;
  if (ranks.empty()) {
    for (int r = 0; r < launch.world_size; ++r) ranks.push_back(r);
  }
  std::string cwd = launch.cwd.empty()
                        ? std::filesystem::path(launch.spec_path).parent_path().string()
                        : launch.cwd;
  for (int r : ranks) {
    SpawnOptions o;
    o.argv = launch.command.empty() ? std::vector<std::string>{TrainerBinary(), "--spec",
                                                               std::filesystem::absolute(
                                                                   launch.spec_path)
                                                                   .string()}
                                    : launch.command;
    o.cwd = cwd;
    o.env = launch.env;
    const int per_node = launch.nproc_per_node > 0 ? launch.nproc_per_node : launch.world_size;
    const int node = r / per_node;
    o.env["RANK"] = std::to_string(r);
    o.env["LOCAL_RANK"] = std::to_string(r % per_node);
    o.env["WORLD_SIZE"] = std::to_string(launch.world_size);
    o.env["LOCAL_WORLD_SIZE"] = std::to_string(per_node);
    o.env["GROUP_RANK"] = std::to_string(node);
    if (node < static_cast<int>(launch.nodes.size())) o.env["DDP_NODE"] = launch.nodes[node];
    o.env["MASTER_ADDR"] = "127.0.0.1";
    o.env["MASTER_PORT"] = std::to_string(group->port_);
    o.env["DDP_EVENTS_FD"] = "3";
    o.events_fd = 3;
    o.capture_stderr = true;
    auto proc = Subprocess::Spawn(o);
    if (!proc.ok()) return proc.status();
    Rank rank;
    rank.rank = r;
    rank.proc = std::move(*proc);
    rank.result.rank = r;
    group->ranks_.push_back(std::move(rank));
  }
  return group;
}

std::vector<RankResult> TrainerGroup::Wait(
    const std::function<bool(int, const Event&)>& on_event, absl::Duration timeout,
    const std::function<bool(int, const std::string&)>& on_stderr) {
  const absl::Time deadline = absl::Now() + timeout;
  struct Stream {
    size_t rank_index;
    int fd;
    bool events;
    LineSplitter splitter;
  };
  std::vector<Stream> streams;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    streams.push_back({i, ranks_[i].proc->events_fd(), true, LineSplitter()});
    streams.push_back({i, ranks_[i].proc->stderr_fd(), false, LineSplitter()});
  }
  bool killed = false;
  auto kill_all = [&] {
    // Stopped first, all of them, then killed: killed one by one, a rank could see its
    // peer's socket close and exit by itself (code 1, no signal) before its own SIGKILL.
    for (Rank& r : ranks_) r.proc->Signal(SIGSTOP);
    for (Rank& r : ranks_) r.proc->Signal(SIGKILL);
    killed = true;
  };
  auto handle_line = [&](Stream& s, const std::string& line) {
    Rank& rank = ranks_[s.rank_index];
    if (!s.events) {
      absl::StrAppend(&rank.result.stderr_text, line, "\n");
      if (on_stderr && !killed && on_stderr(rank.rank, line)) kill_all();
      return;
    }
    Event e;
    if (!google::protobuf::util::JsonStringToMessage(line, &e.fields).ok()) {
      absl::StrAppend(&rank.result.stderr_text, "[unparsable event] ", line, "\n");
      return;
    }
    rank.result.events.push_back(e);
    if (on_event && !killed && on_event(rank.rank, e)) kill_all();
  };
  size_t open = streams.size();
  while (open > 0) {
    std::vector<pollfd> fds;
    std::vector<Stream*> owners;
    for (Stream& s : streams) {
      if (s.fd < 0) continue;
      fds.push_back({s.fd, POLLIN, 0});
      owners.push_back(&s);
    }
    int left_ms = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (left_ms <= 0) {
      if (!killed) {
        // Which ranks were still running, and what each did last: a test that fails
        // on the timeout says who waited for what (every test prints a failed rank's
        // stderr).
        for (const Stream& s : streams) {
          if (!s.events || s.fd < 0) continue;
          RankResult& result = ranks_[s.rank_index].result;
          std::string last = "no event yet";
          if (!result.events.empty()) {
            const Event& e = result.events.back();
            last = absl::StrCat("its last event '", e.type(), "'");
            if (e.Has("epoch")) absl::StrAppend(&last, " epoch ", e.Number("epoch"));
            if (e.Has("step")) absl::StrAppend(&last, " step ", e.Number("step"));
          }
          absl::StrAppend(&result.stderr_text, "[harness] rank ", result.rank,
                          " still running at the ", absl::FormatDuration(timeout),
                          " deadline (", last, "): killed\n");
        }
        kill_all();
      }
      left_ms = 1000;  // Drain what the killed ranks left in their pipes.
    }
    int n = ::poll(fds.data(), fds.size(), std::min(left_ms, 1000));
    if (n < 0 && errno != EINTR) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      char buf[65536];
      ssize_t got = ::read(fds[i].fd, buf, sizeof(buf));
      Stream& s = *owners[i];
      if (got > 0) {
        s.splitter.Feed(buf, static_cast<size_t>(got), [&](const std::string& l) {
          handle_line(s, l);
        });
      } else if (got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN)) {
        s.splitter.Flush([&](const std::string& l) { handle_line(s, l); });
        s.fd = -1;
        --open;
      }
    }
  }
  std::vector<RankResult> out;
  for (Rank& r : ranks_) {
    r.result.exit = r.proc->Wait();
    out.push_back(std::move(r.result));
  }
  return out;
}

void TrainerGroup::Signal(int rank, int signal) {
  for (Rank& r : ranks_) {
    if (r.rank == rank) r.proc->Signal(signal);
  }
}

absl::StatusOr<std::vector<RankResult>> RunTrainers(const TrainerLaunch& launch) {
  auto group = TrainerGroup::Start(launch);
  if (!group.ok()) return group.status();
  return (*group)->Wait();
}

std::string TrainerBinary() { return DDP_TRAINER_BIN; }
std::string SourceDir() { return DDP_SOURCE_DIR; }

absl::StatusOr<google::protobuf::Value> ParseJson(const std::string& text) {
  google::protobuf::Value v;
  auto st = google::protobuf::util::JsonStringToMessage(text, &v);
  if (!st.ok()) return absl::InvalidArgumentError(std::string(st.message()));
  return v;
}

}  // namespace ddp::testing
