#include "common/jobspec/flatten.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "yaml-cpp/yaml.h"

namespace ddp {
namespace {

constexpr size_t kMaxKeyBytes = 250;
constexpr size_t kMaxValueBytes = 6000;

std::string Cut(std::string s, size_t max) {
  if (s.size() <= max) return s;
  s.resize(max - 3);
  // Not in the middle of a UTF-8 sequence.
  while (!s.empty() && (static_cast<unsigned char>(s.back()) & 0xC0) == 0x80) s.pop_back();
  if (!s.empty() && (static_cast<unsigned char>(s.back()) & 0x80)) s.pop_back();
  return s + "...";
}

bool AllScalars(const YAML::Node& seq) {
  for (const auto& item : seq) {
    if (!item.IsScalar() && !item.IsNull()) return false;
  }
  return true;
}

void Walk(const YAML::Node& node, const std::string& path,
          std::vector<std::pair<std::string, std::string>>* out) {
  if (node.IsNull()) return;
  if (node.IsScalar()) {
    out->emplace_back(Cut(path, kMaxKeyBytes), Cut(node.Scalar(), kMaxValueBytes));
    return;
  }
  if (node.IsSequence()) {
    if (AllScalars(node)) {
      std::vector<std::string> items;
      for (const auto& item : node) items.push_back(item.IsNull() ? "null" : item.Scalar());
      out->emplace_back(Cut(path, kMaxKeyBytes),
                        Cut(absl::StrCat("[", absl::StrJoin(items, ", "), "]"), kMaxValueBytes));
      return;
    }
    int i = 0;
    for (const auto& item : node) Walk(item, absl::StrCat(path, ".", i++), out);
    return;
  }
  if (node.IsMap()) {
    for (const auto& kv : node) {
      const std::string key = kv.first.IsScalar() ? kv.first.Scalar() : "?";
      if (path.empty() && key == "env") continue;
      Walk(kv.second, path.empty() ? key : absl::StrCat(path, ".", key), out);
    }
  }
}

}  // namespace

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> FlattenSpec(
    const std::string& yaml_text) {
  YAML::Node root;
  try {
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not valid YAML: ", e.msg));
  }
  std::vector<std::pair<std::string, std::string>> out;
  if (root.IsMap()) Walk(root, "", &out);
  return out;
}

}  // namespace ddp
