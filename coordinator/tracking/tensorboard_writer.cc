#include "coordinator/tracking/tensorboard_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/tensorboard/event_file.h"
#include "common/tensorboard/job_run.h"

namespace ddp {
namespace {

bool Terminal(v1::JobState s) {
  return s == v1::SUCCEEDED || s == v1::FAILED || s == v1::CANCELLED;
}

std::string HostName() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0 || host[0] == '\0') return "localhost";
  return host;
}

size_t Points(const std::vector<JobOutput>& outputs) {
  size_t n = 0;
  for (const JobOutput& o : outputs) n += o.metrics.size() + o.epochs.size();
  return n;
}

}  // namespace

absl::Status TensorBoardWriter::CheckDirectory(const std::string& dir) {
  if (dir.empty()) {
    return absl::InvalidArgumentError("--tensorboard-dir must not be empty");
  }
  if (absl::Status made = tensorboard::MakeDirectories(dir); !made.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--tensorboard-dir ", dir, ": ", made.message()));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tensorboard-dir ", dir, ": cannot write there: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Start(Options options,
                                                                            JobLookup lookup) {
  if (absl::Status st = CheckDirectory(options.dir); !st.ok()) return st;
  const int64_t now_ms = absl::ToUnixMillis(absl::Now());
  return std::unique_ptr<TensorBoardWriter>(
      new TensorBoardWriter(std::move(options), std::move(lookup), now_ms));
}

TensorBoardWriter::TensorBoardWriter(Options options, JobLookup lookup, int64_t start_ms)
    : options_(std::move(options)), lookup_(std::move(lookup)), start_ms_(start_ms) {
  // TensorBoard's own naming: events.out.tfevents.<seconds>.<host>.<pid>.<suffix>.
  file_name_ = absl::StrCat(
      "events.out.tfevents.",
      options_.file_suffix.empty()
          ? absl::StrCat(start_ms_ / 1000, ".", HostName(), ".", ::getpid(), ".ddp-coordinator")
          : options_.file_suffix);
  thread_ = std::thread([this] { Loop(); });
}

TensorBoardWriter::~TensorBoardWriter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
  while (!open_.empty()) Close(open_.front());
}

void TensorBoardWriter::Stored(const std::vector<JobOutput>& outputs) {
  Item item;
  for (const JobOutput& o : outputs) {
    if (o.metrics.empty() && o.epochs.empty()) continue;  // Output lines only.
    item.outputs.push_back({o.job_id, o.metrics, o.epochs, {}});
  }
  if (item.outputs.empty()) return;
  const size_t points = Points(item.outputs);
  absl::MutexLock lock(&mu_);
  if (queued_points_ + points > options_.max_queued) {
    if (stats_.dropped == 0) {
      DDP_LOG(WARNING) << "--tensorboard-dir " << options_.dir << ": " << queued_points_
                       << " points wait to be written; dropping new ones (the store has them: "
                          "`ddpctl tensorboard JOB DIR` exports them)";
    }
    stats_.dropped += static_cast<int64_t>(points);
    return;
  }
  queued_points_ += points;
  queue_.push_back(std::move(item));
  ++enqueued_;
}

void TensorBoardWriter::Changed(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  // One pending look per job is enough: it sees the job as it is when it is taken.
  for (auto it = queue_.rbegin(); it != queue_.rend(); ++it) {
    if (it->changed == job_id) return;
  }
  Item item;
  item.changed = job_id;
  queue_.push_back(std::move(item));
  ++enqueued_;
}

void TensorBoardWriter::Flush() {
  absl::MutexLock lock(&mu_);
  const int64_t target = enqueued_;
  auto written = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ >= target || stop_; };
  mu_.Await(absl::Condition(&written));
}

TensorBoardWriter::Stats TensorBoardWriter::stats() {
  absl::MutexLock lock(&mu_);
  return stats_;
}

void TensorBoardWriter::Loop() {
  while (true) {
    Item item;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&ready));
      if (queue_.empty()) return;  // Stopping, and all is written.
      item = std::move(queue_.front());
      queue_.pop_front();
      queued_points_ -= Points(item.outputs);
    }
    Write(item);
    absl::MutexLock lock(&mu_);
    ++done_;
    stats_.open_files = open_.size();
  }
}

void TensorBoardWriter::Write(const Item& item) {
  if (!item.changed.empty()) {
    WriteJob(item.changed);
    return;
  }
  for (const JobOutput& o : item.outputs) {
    tensorboard::EventFile batch;
    for (const v1::RankMetrics& m : o.metrics) tensorboard::AddStep(m, &batch);
    for (const v1::EpochSummary& e : o.epochs) tensorboard::AddEpoch(e, &batch);
    const int64_t events = batch.events();
    Append(o.job_id, batch.Take(), events);
  }
}

void TensorBoardWriter::WriteJob(const std::string& job_id) {
  if (finished_.count(job_id)) return;  // Every text of it is written.
  auto job = lookup_(job_id);
  if (!job.ok()) {
    if (job.status().code() == absl::StatusCode::kNotFound) {  // Deleted (retention).
      Close(job_id);
      finished_.erase(job_id);
    }
    return;
  }
  tensorboard::EventFile batch;
  for (const v1::Attempt& a : job->attempts()) {
    for (const v1::Recovery& r : a.recoveries()) {
      if (r.end_ms() == 0 || r.end_ms() < start_ms_) continue;
      if (written_texts_.insert(absl::StrCat(job_id, "/", a.number(), "/", r.generation()))
              .second) {
        tensorboard::AddRecovery(a.number(), r, &batch);
      }
    }
    if (!Terminal(a.state()) || a.end_ms() < start_ms_) continue;
    if (written_texts_.insert(absl::StrCat(job_id, "/", a.number())).second) {
      tensorboard::AddAttempt(*job, a, &batch);
    }
  }
  if (batch.events() > 0) {
    const int64_t events = batch.events();
    Append(job_id, batch.Take(), events);
  }
  if (Terminal(job->state())) {
    Close(job_id);
    finished_.insert(job_id);
    // Its texts are written, and a finished job changes no more: what is remembered of
    // each can go.
    for (auto it = written_texts_.lower_bound(job_id + "/");
         it != written_texts_.end() && it->compare(0, job_id.size() + 1, job_id + "/") == 0;) {
      it = written_texts_.erase(it);
    }
  }
}

void TensorBoardWriter::Append(const std::string& job_id, const std::string& bytes,
                               int64_t events) {
  if (!tensorboard::IsRunName(job_id)) return;  // Ids are generated; never a path.
  Run& run = runs_[job_id];
  auto fail = [&](const std::string& what) {
    if (!run.failed) {
      DDP_LOG(ERROR) << "--tensorboard-dir: " << what << " (job " << job_id
                     << "; later errors of this run are counted, not logged)";
      run.failed = true;
    }
    absl::MutexLock lock(&mu_);
    ++stats_.write_errors;
  };
  if (run.fd < 0) {
    const std::string dir = absl::StrCat(options_.dir, "/", job_id);
    if (absl::Status made = tensorboard::MakeDirectories(dir); !made.ok()) {
      fail(std::string(made.message()));
      return;
    }
    const std::string path = absl::StrCat(dir, "/", file_name_);
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      fail(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
      return;
    }
    struct stat st{};
    if (::fstat(fd, &st) == 0 && st.st_size == 0) {
      const std::string head = tensorboard::Record(
          tensorboard::FileVersionEvent(static_cast<double>(start_ms_) / 1000.0));
      if (::write(fd, head.data(), head.size()) != static_cast<ssize_t>(head.size())) {
        fail(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
        ::close(fd);
        return;
      }
      absl::MutexLock lock(&mu_);
      ++stats_.events;
    }
    run.fd = fd;
    open_.push_back(job_id);
    run.lru = std::prev(open_.end());
    while (open_.size() > options_.max_open_files) Close(open_.front());
  } else {
    open_.splice(open_.end(), open_, run.lru);
  }
  // One write per batch: TensorBoard, reading the file as it grows, sees whole records
  // (a short write is retried from where it stopped).
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::write(run.fd, bytes.data() + off, bytes.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      fail(absl::StrCat("cannot write ", options_.dir, "/", job_id, "/", file_name_, ": ",
                        std::strerror(errno)));
      return;
    }
    off += static_cast<size_t>(n);
  }
  absl::MutexLock lock(&mu_);
  stats_.events += events;
}

void TensorBoardWriter::Close(const std::string& job_id) {
  auto it = runs_.find(job_id);
  if (it == runs_.end()) return;
  if (it->second.fd >= 0) {
    ::close(it->second.fd);
    open_.erase(it->second.lru);
  }
  // A finished job's run is forgotten; late output opens its file again.
  runs_.erase(it);
}

}  // namespace ddp
