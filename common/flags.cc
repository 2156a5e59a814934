#include "common/flags.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace ddp {

FlagSet::FlagSet(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

void FlagSet::Add(Flag flag) { flags_.push_back(std::move(flag)); }

void FlagSet::String(const std::string& name, std::string* target, const std::string& help) {
  Add({name, help, *target, false, [target](const std::string& v, std::string*) {
         *target = v;
         return true;
       }});
}

void FlagSet::StringList(const std::string& name, std::vector<std::string>* target,
                         const std::string& help) {
  Add({name, help + " (repeatable)", "", false, [target](const std::string& v, std::string*) {
         target->push_back(v);
         return true;
       }});
}

void FlagSet::Int(const std::string& name, int64_t* target, const std::string& help) {
  Add({name, help, absl::StrCat(*target), false,
       [target](const std::string& v, std::string* err) {
         if (absl::SimpleAtoi(v, target)) return true;
         *err = absl::StrCat("expected an integer, got '", v, "'");
         return false;
       }});
}

void FlagSet::Int(const std::string& name, int* target, const std::string& help) {
  Add({name, help, absl::StrCat(*target), false,
       [target](const std::string& v, std::string* err) {
         if (absl::SimpleAtoi(v, target)) return true;
         *err = absl::StrCat("expected an integer, got '", v, "'");
         return false;
       }});
}

void FlagSet::Double(const std::string& name, double* target, const std::string& help) {
  Add({name, help, absl::StrCat(*target), false,
       [target](const std::string& v, std::string* err) {
         if (absl::SimpleAtod(v, target)) return true;
         *err = absl::StrCat("expected a number, got '", v, "'");
         return false;
       }});
}

void FlagSet::Bool(const std::string& name, bool* target, const std::string& help) {
  Add({name, help, *target ? "true" : "false", true,
       [target](const std::string& v, std::string* err) {
         if (absl::SimpleAtob(v, target)) return true;
         *err = absl::StrCat("expected true or false, got '", v, "'");
         return false;
       }});
}

void FlagSet::Duration(const std::string& name, absl::Duration* target,
                       const std::string& help) {
  Add({name, help, absl::FormatDuration(*target), false,
       [target](const std::string& v, std::string* err) {
         if (absl::ParseDuration(v, target) && *target >= absl::ZeroDuration()) return true;
         *err = absl::StrCat("expected a duration such as 500ms, 2s or 1m, got '", v, "'");
         return false;
       }});
}

void FlagSet::Alias(const std::string& alias, const std::string& name) {
  aliases_.emplace_back(alias, name);
}

FlagSet::Flag* FlagSet::Find(const std::string& name) {
  std::string resolved = name;
  for (const auto& [alias, target] : aliases_) {
    if (alias == name) resolved = target;
  }
  for (Flag& f : flags_) {
    if (f.name == resolved) return &f;
  }
  return nullptr;
}

absl::StatusOr<std::vector<std::string>> FlagSet::Parse(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return Parse(args);
}

absl::StatusOr<std::vector<std::string>> FlagSet::Parse(const std::vector<std::string>& args) {
  std::vector<std::string> positional;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      positional.insert(positional.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (arg.size() < 2 || arg[0] != '-' || arg == "-") {
      positional.push_back(arg);
      continue;
    }
    std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    std::string name = body;
    std::string value;
    bool has_value = false;
    if (size_t eq = body.find('='); eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
      has_value = true;
    }
    if (name == "help" || name == "h") {
      help_requested_ = true;
      continue;
    }
    Flag* flag = Find(name);
    if (flag == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, " (see ", program_, " --help)"));
    }
    if (!has_value) {
      if (flag->is_bool) {
        value = "true";
      } else if (i + 1 < args.size()) {
        value = args[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--", name, ": missing value"));
      }
    }
    std::string err;
    if (!flag->set(value, &err)) {
      return absl::InvalidArgumentError(absl::StrCat("--", name, ": ", err));
    }
  }
  return positional;
}

std::vector<FlagSet::Info> FlagSet::Describe() const {
  std::vector<Info> out;
  for (const Flag& f : flags_) {
    Info info{f.name, f.help, !f.is_bool, {}};
    for (const auto& [alias, target] : aliases_) {
      if (target == f.name) info.aliases.push_back(alias);
    }
    out.push_back(std::move(info));
  }
  return out;
}

std::string FlagSet::Usage(const std::string& synopsis) const {
  std::string out = absl::StrCat("usage: ", program_, synopsis.empty() ? " [flags]" : synopsis,
                                 "\n\n", summary_, "\n\nflags:\n");
  for (const Flag& f : flags_) {
    std::string left = absl::StrCat("  --", f.name);
    for (const auto& [alias, target] : aliases_) {
      if (target == f.name) absl::StrAppend(&left, ", -", alias);
    }
    absl::StrAppendFormat(&out, "%-26s %s", left, f.help);
    if (!f.default_text.empty()) absl::StrAppend(&out, " (default: ", f.default_text, ")");
    out += "\n";
  }
  return out;
}

}  // namespace ddp
