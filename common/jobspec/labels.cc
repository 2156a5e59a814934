#include "common/jobspec/labels.h"

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace ddp {
namespace {

bool LabelChar(char c, bool slash) {
  return absl::ascii_isalnum(c) || c == '.' || c == '_' || c == '-' || (slash && c == '/');
}

}  // namespace

bool ValidLabelKey(const std::string& key) {
  if (key.empty() || key.size() > 63 || !absl::ascii_isalnum(key[0])) return false;
  for (char c : key) {
    if (!LabelChar(c, /*slash=*/true)) return false;
  }
  return true;
}

bool ValidLabelValue(const std::string& value) {
  if (value.size() > 63) return false;
  for (char c : value) {
    if (!LabelChar(c, /*slash=*/false)) return false;
  }
  return true;
}

absl::Status CheckLabels(const Labels& labels) {
  if (labels.size() > kMaxLabels) {
    return absl::InvalidArgumentError(
        absl::StrCat("at most ", kMaxLabels, " labels (got ", labels.size(), ")"));
  }
  for (const auto& [key, value] : labels) {
    if (!ValidLabelKey(key)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label key '", key,
          "': use 1-63 letters, digits, '.', '_', '-' or '/', starting with a letter or digit"));
    }
    if (!ValidLabelValue(value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label ", key, "='", value, "': a value is 0-63 letters, digits, '.', '_' or '-'"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Labels> ParseLabelList(const std::vector<std::string>& entries) {
  Labels labels;
  for (const std::string& entry : entries) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("label '", entry, "': expected KEY=VALUE (e.g. pool=team-a)"));
    }
    std::string key = entry.substr(0, eq);
    if (!labels.emplace(key, entry.substr(eq + 1)).second) {
      return absl::InvalidArgumentError(absl::StrCat("label '", key, "' given twice"));
    }
  }
  if (absl::Status st = CheckLabels(labels); !st.ok()) return st;
  return labels;
}

bool SelectorMatches(const Labels& selector, const Labels& labels) {
  for (const auto& [key, value] : selector) {
    auto it = labels.find(key);
    if (it == labels.end() || it->second != value) return false;
  }
  return true;
}

bool SelectorsDisjoint(const Labels& a, const Labels& b) {
  for (const auto& [key, value] : a) {
    auto it = b.find(key);
    if (it != b.end() && it->second != value) return true;
  }
  return false;
}

std::string FormatLabels(const Labels& labels) {
  return absl::StrJoin(labels, ",", absl::PairFormatter("="));
}

}  // namespace ddp
