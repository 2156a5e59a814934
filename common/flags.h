// A small command-line flag parser for ddp's binaries.
//
// absl::flags cannot spell the flag names users see in the docs (`--state-dir`,
// `--advertise-addr`), so each main.cc declares its flags on a FlagSet bound to the
// fields of an options struct, then parses argv:
//
//   CoordinatorOptions opts;
//   FlagSet flags("ddp-coordinator", "Runs the cluster's coordinator.");
//   flags.String("listen", &opts.listen, "HOST:PORT to serve gRPC on");
//   auto positional = flags.Parse(argc, argv);
//
// Accepted forms: `--name=value`, `--name value`, `--bool`, `--bool=false`, and `--`
// to end flags. Durations use absl syntax ("500ms", "2s", "1m").
#ifndef DDP_COMMON_FLAGS_H_
#define DDP_COMMON_FLAGS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace ddp {

class FlagSet {
 public:
  FlagSet(std::string program, std::string summary);
  const std::string& program() const { return program_; }

  void String(const std::string& name, std::string* target, const std::string& help);
  void Int(const std::string& name, int64_t* target, const std::string& help);
  void Int(const std::string& name, int* target, const std::string& help);
  void Double(const std::string& name, double* target, const std::string& help);
  void Bool(const std::string& name, bool* target, const std::string& help);
  void Duration(const std::string& name, absl::Duration* target, const std::string& help);
  // Repeatable: each `--name value` appends to `target`.
  void StringList(const std::string& name, std::vector<std::string>* target,
                  const std::string& help);
  // A short alias (e.g. "o" for "output") for an already declared flag.
  void Alias(const std::string& alias, const std::string& name);

  // Parses argv[1..], returning the positional arguments. Errors name the flag:
  // "--slots: expected an integer, got 'x'". `--help` sets help_requested().
  absl::StatusOr<std::vector<std::string>> Parse(int argc, char** argv);
  absl::StatusOr<std::vector<std::string>> Parse(const std::vector<std::string>& args);

  bool help_requested() const { return help_requested_; }
  struct Info {
    std::string name;  // Without dashes.
    std::string help;
    bool takes_value = true;
    std::vector<std::string> aliases;  // Short names ("o").
  };
  // Every flag, in declaration order (for shell completion).
  std::vector<Info> Describe() const;
  // "usage: <program> ..." followed by one line per flag with its default.
  std::string Usage(const std::string& synopsis = "") const;

 private:
  struct Flag {
    std::string name;
    std::string help;
    std::string default_text;
    bool is_bool = false;
    std::function<bool(const std::string&, std::string*)> set;  // false + error text
  };
  Flag* Find(const std::string& name);
  void Add(Flag flag);

  std::string program_;
  std::string summary_;
  std::vector<Flag> flags_;
  std::vector<std::pair<std::string, std::string>> aliases_;
  bool help_requested_ = false;
};

}  // namespace ddp

#endif  // DDP_COMMON_FLAGS_H_
