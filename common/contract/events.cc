#include "common/contract/events.h"

#include <errno.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace ddp {
namespace {

// The names of a nested struct's fields: "epoch, step, global_step".
class NameLister {
 public:
  explicit NameLister(std::vector<std::string>* names) : names_(names) {}
  template <typename T>
  void operator()(const char* name, const T&, const char*) {
    names_->push_back(name);
  }

 private:
  std::vector<std::string>* names_;
};

template <typename S>
std::string NestedNames() {
  std::vector<std::string> names;
  const S s{};
  S::Fields(s, NameLister(&names));
  return absl::StrJoin(names, ", ");
}

// One entry of a row's field list: `name`, `name`: `{a, b}`, `name`: `[{a, b}]`, each
// followed by its note in parentheses.
class DocFieldWriter {
 public:
  explicit DocFieldWriter(std::vector<std::string>* items) : items_(items) {}
  template <typename T>
  void operator()(const char* name, const T&, const char* note) {
    Add(absl::StrCat("`", name, "`"), note);
  }
  template <typename S>
  void operator()(const char* name, const std::optional<S>&, const char* note) {
    Add(absl::StrCat("`", name, "`: `{", NestedNames<S>(), "}`"), note);
  }
  void operator()(const char* name, const std::optional<double>&, const char* note) {
    Add(absl::StrCat("`", name, "`"), note);
  }
  template <typename S>
  void operator()(const char* name, const std::vector<S>&, const char* note) {
    Add(absl::StrCat("`", name, "`: `[{", NestedNames<S>(), "}]`"), note);
  }

 private:
  void Add(std::string item, const char* note) {
    if (note[0] != '\0') absl::StrAppend(&item, " (", note, ")");
    items_->push_back(std::move(item));
  }
  std::vector<std::string>* items_;
};

}  // namespace

std::string EventsMarkdownTable() {
  std::string out = "| type | from | fields |\n| --- | --- | --- |\n";
  ForEachEventType([&out](auto event) {
    using E = decltype(event);
    std::vector<std::string> items;
    E::Fields(event, DocFieldWriter(&items));
    absl::StrAppend(&out, "| `", E::kType, "` | ", E::kFrom, " | ", absl::StrJoin(items, ", "),
                    " |\n");
  });
  return out;
}

EventSink::EventSink(int fd, int rank) : fd_(fd < 0 ? STDOUT_FILENO : fd), rank_(rank) {}

double EventSink::NowSeconds() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

void EventSink::Write(const std::string& line) {
  std::lock_guard<std::mutex> lock(mu_);
  if (broken_) return;
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {
    ssize_t n = ::write(fd_, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      broken_ = true;
      return;
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace ddp
