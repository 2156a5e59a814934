// The YAML walker behind ParseJobSpec (internal to ddp_jobspec): typed reads of
// fields that collect every problem with its field path and line instead of
// stopping at the first, unknown and duplicate keys included.
#ifndef DDP_COMMON_JOBSPEC_YAML_READER_H_
#define DDP_COMMON_JOBSPEC_YAML_READER_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/jobspec/job_spec.h"
#include "common/jobspec/job_text.h"
#include "yaml-cpp/yaml.h"

namespace ddp::jobspec_internal {

// Levenshtein distance, for "did you mean" hints.
size_t EditDistance(const std::string& a, const std::string& b);

// The line (1-based) where the second YAML document of `text` begins: its `---`, or
// its first token; 0 when there is one document. yaml-cpp's Load reads the first
// document and silently drops the rest, so a job file of two would run half of what
// its author wrote. Throws YAML::Exception on text that is not YAML.
int SecondDocumentLine(const std::string& text);

// Walks the YAML tree, collecting every problem with its field path and line.
class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  const std::vector<std::string>& errors() const { return errors_; }

  void Error(const YAML::Node& at, const std::string& path, const std::string& what) {
    int line = at.IsDefined() ? at.Mark().line + 1 : 0;
    if (line <= 0) line = last_line_;
    errors_.push_back(absl::StrCat(source_, ":", line, ": ", path, ": ", what));
  }

  static std::string Join(const std::string& path, const std::string& key) {
    return path.empty() ? key : absl::StrCat(path, ".", key);
  }

  // True if `node` is a map; reports unknown keys (with a suggestion).
  bool Map(const YAML::Node& node, const std::string& path,
           std::initializer_list<const char*> allowed) {
    if (!node.IsMap()) {
      Error(node, path.empty() ? "(top level)" : path, "expected a mapping of fields");
      return false;
    }
    Touch(node);
    std::map<std::string, int> seen;  // key -> its first line
    for (const auto& kv : node) {
      std::string key;
      if (!Key(kv.first, path, &key)) continue;
      if (!Unique(kv.first, Join(path, key), &seen)) continue;
      if (std::find_if(allowed.begin(), allowed.end(),
                       [&](const char* a) { return key == a; }) != allowed.end()) {
        continue;
      }
      std::string hint;
      size_t best = 3;
      for (const char* a : allowed) {
        size_t d = EditDistance(key, a);
        if (d < best) {
          best = d;
          hint = absl::StrCat(" (did you mean ", a, "?)");
        }
      }
      if (hint.empty()) {
        std::vector<std::string> names(allowed.begin(), allowed.end());
        hint = absl::StrCat(" (known: ", absl::StrJoin(names, ", "), ")");
      }
      Error(kv.first, Join(path, key), absl::StrCat("unknown field", hint));
    }
    return true;
  }

  // A mapping's key as a name. YAML allows any node as a key (`? [a, b] : c`); a
  // job file's keys are field names, so anything but a scalar is an error that
  // says what was found there.
  bool Key(const YAML::Node& key, const std::string& path, std::string* out) {
    if (key.IsScalar()) {
      *out = key.Scalar();
      return true;
    }
    Error(key, path.empty() ? "(top level)" : path,
          absl::StrCat("a key must be a field name, found ", ShowKey(key)));
    return false;
  }

  // False (and an error) if `key` was already in `seen`: yaml-cpp keeps both, and
  // which one a lookup finds is not what the author meant.
  bool Unique(const YAML::Node& key, const std::string& path, std::map<std::string, int>* seen) {
    const int line = key.Mark().line + 1;
    auto [it, inserted] = seen->emplace(key.Scalar(), line);
    if (inserted) return true;
    Error(key, path, absl::StrCat("given twice (first on line ", it->second, ")"));
    return false;
  }

  // Exactly one of `choices` must be present; returns its index or -1.
  int OneOf(const YAML::Node& map, const std::string& path,
            const std::vector<const char*>& choices) {
    int found = -1;
    for (size_t i = 0; i < choices.size(); ++i) {
      if (!map[choices[i]]) continue;
      if (found >= 0) {
        Error(map[choices[i]], path,
              absl::StrCat("give only one of ", choices[found], " and ", choices[i]));
        return -1;
      }
      found = static_cast<int>(i);
    }
    if (found < 0) {
      Error(map, path, absl::StrCat("one of ", absl::StrJoin(choices, ", "), " is required"));
    }
    return found;
  }

  bool Int(const YAML::Node& map, const char* key, const std::string& path, int64_t* out,
           bool required = false) {
    const YAML::Node n = map[key];
    std::string p = Join(path, key);
    if (!Present(map, n, p, required)) return false;
    int64_t v;
    if (!n.IsScalar() || !absl::SimpleAtoi(n.Scalar(), &v)) {
      Error(n, p, absl::StrCat("expected an integer, got ", Show(n)));
      return false;
    }
    *out = v;
    return true;
  }

  bool Int(const YAML::Node& map, const char* key, const std::string& path, int* out,
           bool required = false) {
    int64_t v = *out;
    if (!Int(map, key, path, &v, required)) return false;
    if (v < INT32_MIN || v > INT32_MAX) {
      Error(map[key], Join(path, key), "out of range");
      return false;
    }
    *out = static_cast<int>(v);
    return true;
  }

  bool Double(const YAML::Node& map, const char* key, const std::string& path, double* out,
              bool required = false) {
    const YAML::Node n = map[key];
    std::string p = Join(path, key);
    if (!Present(map, n, p, required)) return false;
    double v;
    if (!n.IsScalar() || !absl::SimpleAtod(n.Scalar(), &v) || !std::isfinite(v)) {
      Error(n, p, absl::StrCat("expected a number, got ", Show(n)));
      return false;
    }
    *out = v;
    return true;
  }

  bool Bool(const YAML::Node& map, const char* key, const std::string& path, bool* out) {
    const YAML::Node n = map[key];
    std::string p = Join(path, key);
    if (!Present(map, n, p, false)) return false;
    bool v;
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) {
      Error(n, p, absl::StrCat("expected true or false, got ", Show(n)));
      return false;
    }
    *out = v;
    return true;
  }

  // true, false, or the one word `word`: *out becomes 1, 0 or 2.
  bool BoolOrWord(const YAML::Node& map, const char* key, const std::string& path,
                  const char* word, int* out) {
    const YAML::Node n = map[key];
    std::string p = Join(path, key);
    if (!Present(map, n, p, false)) return false;
    bool v;
    if (n.IsScalar() && n.Scalar() == word) {
      *out = 2;
    } else if (n.IsScalar() && YAML::convert<bool>::decode(n, v)) {
      *out = v ? 1 : 0;
    } else {
      Error(n, p, absl::StrCat("expected true, false or ", word, ", got ", Show(n)));
      return false;
    }
    return true;
  }

  bool String(const YAML::Node& map, const char* key, const std::string& path,
              std::string* out, bool required = false) {
    const YAML::Node n = map[key];
    std::string p = Join(path, key);
    if (!Present(map, n, p, required)) return false;
    if (!n.IsScalar()) {
      Error(n, p, absl::StrCat("expected a string, got ", Show(n)));
      return false;
    }
    if (n.Scalar().size() > kMaxStringBytes) {
      Error(n, p, absl::StrCat("is longer than ", kMaxStringBytes, " bytes"));
      return false;
    }
    if (HasControlCharacter(n.Scalar())) {
      Error(n, p, "must not hold control characters");
      return false;
    }
    *out = n.Scalar();
    if (required && out->empty()) {
      Error(n, p, "must not be empty");
      return false;
    }
    return true;
  }

  bool IntList(const YAML::Node& map, const char* key, const std::string& path,
               std::vector<int64_t>* out) {
    const YAML::Node n = map[key];
    std::string p = Join(path, key);
    if (!Present(map, n, p, false)) return false;
    if (!n.IsSequence()) {
      Error(n, p, absl::StrCat("expected a list of integers such as [64, 32], got ", Show(n)));
      return false;
    }
    if (n.size() > kMaxListEntries) {
      Error(n, p, absl::StrCat("at most ", kMaxListEntries, " entries (got ", n.size(), ")"));
      return false;
    }
    std::vector<int64_t> v;
    for (size_t i = 0; i < n.size(); ++i) {
      int64_t x;
      if (!n[i].IsScalar() || !absl::SimpleAtoi(n[i].Scalar(), &x)) {
        Error(n[i], absl::StrCat(p, "[", i, "]"), absl::StrCat("expected an integer, got ",
                                                             Show(n[i])));
        return false;
      }
      v.push_back(x);
    }
    *out = std::move(v);
    return true;
  }

  // Node of a sub-map, or an undefined node; reports non-maps.
  YAML::Node Sub(const YAML::Node& map, const char* key) {
    YAML::Node n = map[key];
    if (n) Touch(n);
    return n;
  }

  void Touch(const YAML::Node& n) {
    if (n.IsDefined() && n.Mark().line >= 0) last_line_ = n.Mark().line + 1;
  }

 private:
  bool Present(const YAML::Node& map, const YAML::Node& n, const std::string& p,
               bool required) {
    if (n && !n.IsNull()) {
      Touch(n);
      return true;
    }
    if (required) Error(map, p, "is required");
    return false;
  }

  // A non-scalar key, in YAML's flow style and cut short: "a list [a, b]".
  static std::string ShowKey(const YAML::Node& n) {
    if (!n.IsSequence() && !n.IsMap()) return "an empty key";
    YAML::Emitter flow;
    flow.SetSeqFormat(YAML::Flow);
    flow.SetMapFormat(YAML::Flow);
    flow << n;
    std::string text = flow.good() ? flow.c_str() : "";
    constexpr size_t kShown = 60;
    if (text.size() > kShown) text = text.substr(0, kShown) + "...";
    return absl::StrCat(n.IsSequence() ? "a list " : "a mapping ", text);
  }

  static std::string Show(const YAML::Node& n) {
    if (n.IsScalar()) return absl::StrCat("'", n.Scalar(), "'");
    if (n.IsSequence()) return "a list";
    if (n.IsMap()) return "a mapping";
    return "nothing";
  }

  std::string source_;
  std::vector<std::string> errors_;
  int last_line_ = 1;
};


// Validation helpers: each reports through the reader and never throws.
inline void Positive(Reader& r, const YAML::Node& map, const char* key, const std::string& path,
              double v) {
  if (v <= 0) r.Error(map[key], Reader::Join(path, key), absl::StrCat("must be > 0 (got ", v, ")"));
}

inline void NonNegative(Reader& r, const YAML::Node& map, const char* key, const std::string& path,
                 double v) {
  if (v < 0) {
    r.Error(map[key], Reader::Join(path, key), absl::StrCat("must be >= 0 (got ", v, ")"));
  }
}

inline void AtMost(Reader& r, const YAML::Node& map, const char* key, const std::string& path,
            double v, double max) {
  if (v > max) {
    r.Error(map[key], Reader::Join(path, key), absl::StrCat("must be <= ", max, " (got ", v, ")"));
  }
}

inline void AtMost(Reader& r, const YAML::Node& map, const char* key, const std::string& path,
            int64_t v, int64_t max) {
  if (v > max) {
    r.Error(map[key], Reader::Join(path, key), absl::StrCat("must be <= ", max, " (got ", v, ")"));
  }
}

}  // namespace ddp::jobspec_internal

#endif  // DDP_COMMON_JOBSPEC_YAML_READER_H_
