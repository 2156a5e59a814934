// How long the worker takes to read one event line from a user's program, before and
// after the agent's own JSON reader (issue 28, item 1), side by side in one run:
//   before: protobuf's JsonStringToMessage into a Struct (what ParseProgramEvent did);
//   after:  ParseProgramEvent as it is now (worker/agent/event_json.h).
// Lines: a flat 60 KB step line (a 10,000-number array), one nested to the limit
// throughout, and step lines whose extra field nests `depth` arrays (60 KB at depth
// 30,000: the report's line).
//   ddp-bench-event-parse [--before-max-depth N]   (default 8000: deeper takes minutes)
// Prints one JSON object per line: {"line", "bytes", "before_ms", "after_ms", "after"}.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "worker/agent/trainer_event_parser.h"

namespace {

template <typename Fn>
double MillisOf(const Fn& fn, int repeats) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < repeats; ++i) fn();
  const std::chrono::duration<double, std::milli> d = std::chrono::steady_clock::now() - start;
  return d.count() / repeats;
}

// `before_repeats` 0: protobuf's parser is not timed on this line (-1 in the output).
void Measure(const char* name, const std::string& line, int before_repeats) {
  const int repeats = 20;
  double before_ms = -1;
  if (before_repeats > 0) {
    before_ms = MillisOf([&] {
      google::protobuf::Struct s;
      (void)google::protobuf::util::JsonStringToMessage(line, &s);
    }, before_repeats);
  }
  std::string why;
  ddp::ProgramLine result{};
  const double after_ms = MillisOf([&] {
    ddp::v1::TrainerEvent event;
    result = ddp::ParseProgramEvent(line, 0, 0.0, &event, &why);
  }, repeats);
  std::printf("{\"line\": \"%s\", \"bytes\": %zu, \"before_ms\": %.3f, \"after_ms\": %.4f, "
              "\"after\": \"%s\"}\n",
              name, line.size(), before_ms, after_ms,
              result == ddp::ProgramLine::kEvent ? "event" : why.c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  int before_max_depth = 8000;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--before-max-depth") == 0) before_max_depth = std::atoi(argv[i + 1]);
  }
  std::string flat = R"({"type":"step","loss":0.5,"x":[)";
  while (flat.size() < 60'000) flat += "0.125,";
  flat += "1]}";
  Measure("flat 60 KB", flat, 20);
  // The deepest a line may be, all the way: groups nested 30 deep (31 with their
  // array, 32 with the object) repeated to 60 KB. The reader's worst accepted case.
  std::string deep = R"({"type":"step","loss":0.5,"x":[)";
  const std::string group = std::string(30, '[') + "0" + std::string(30, ']');
  while (deep.size() < 60'000) deep += group + ",";
  deep += "0]}";
  Measure("nested 32 deep throughout, 60 KB", deep, 20);
  for (int depth : {2000, 4000, 8000, 30000}) {
    const std::string line = std::string(R"({"type":"step","loss":0.5,"x":)") +
                             std::string(depth, '[') + std::string(depth, ']') + "}";
    const std::string name = "nested depth " + std::to_string(depth);
    Measure(name.c_str(), line, depth <= before_max_depth ? 1 : 0);
  }
  return 0;
}
