#include "worker/agent/job_sandbox.h"

#include <filesystem>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace ddp {
namespace {

namespace fs = std::filesystem;

bool Within(const fs::path& p, const fs::path& root) {
  auto [root_end, p_it] = std::mismatch(root.begin(), root.end(), p.begin(), p.end());
  return root_end == root.end();
}

// The built-in trainer's paths: data files, the TorchScript model, checkpoints.
void AddTrainerPaths(const JobSpec& spec, const std::string& job_id,
                     std::vector<std::pair<std::string, std::string>>* out) {
  auto& paths = *out;
  switch (spec.data.kind) {
    case DataSpec::Kind::kCsv:
      paths.push_back({"data.csv.path", spec.data.csv.path});
      break;
    case DataSpec::Kind::kIdx:
      paths.push_back({"data.idx.images", spec.data.idx.images});
      paths.push_back({"data.idx.labels", spec.data.idx.labels});
      break;
    case DataSpec::Kind::kSynthetic:
      break;
    case DataSpec::Kind::kTokens:
      paths.push_back({"data.tokens.path", spec.data.tokens.path});
      break;
  }
  if (spec.data.validation.has_idx) {
    paths.push_back({"data.validation.idx.images", spec.data.validation.idx.images});
    paths.push_back({"data.validation.idx.labels", spec.data.validation.idx.labels});
  }
  if (spec.data.validation.has_tokens) {
    paths.push_back({"data.validation.tokens.path", spec.data.validation.tokens.path});
  }
  if (spec.model.kind == ModelSpec::Kind::kTorchScript) {
    paths.push_back({"model.torchscript.path", spec.model.torchscript.path});
  }
  if (!spec.checkpoint.dir.empty()) {
    paths.push_back(
        {"checkpoint.dir", absl::StrReplaceAll(spec.checkpoint.dir, {{"{job_id}", job_id}})});
  }
}

}  // namespace

absl::StatusOr<std::vector<std::string>> CanonicalRoots(const std::vector<std::string>& roots) {
  std::vector<std::string> out;
  for (const std::string& r : roots) {
    std::error_code ec;
    fs::path canonical = fs::canonical(r, ec);
    if (ec || !fs::is_directory(canonical)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--allow-root ", r, ": not an existing directory"));
    }
    out.push_back(canonical.string());
  }
  return out;
}

absl::Status CheckJobPaths(const JobSpec& spec, const std::string& cwd, const std::string& job_id,
                           const std::string& own_dir, const std::vector<std::string>& roots) {
  if (roots.empty()) return absl::OkStatus();
  std::vector<std::pair<std::string, std::string>> paths = {{"workdir", cwd}};
  // A command job names only its workdir and program (launch_plan.h checks the
  // program against --allow-exec); what the program opens is its own affair.
  if (!spec.is_command()) AddTrainerPaths(spec, job_id, &paths);
  std::error_code ec;
  const fs::path own = fs::weakly_canonical(own_dir, ec);
  for (const auto& [field, path] : paths) {
    const fs::path given(path);
    const fs::path absolute = given.is_absolute() ? given : fs::path(cwd) / given;
    // Symlinks followed as far as the path exists; the rest (a checkpoint dir not
    // made yet) normalized, `..` included.
    const fs::path resolved = fs::weakly_canonical(absolute, ec).lexically_normal();
    if (ec) {
      return absl::PermissionDeniedError(
          absl::StrCat(field, ": cannot resolve ", path, " (", ec.message(), ")"));
    }
    bool allowed = !own_dir.empty() && Within(resolved, own);
    for (const std::string& root : roots) allowed = allowed || Within(resolved, fs::path(root));
    if (!allowed) {
      return absl::PermissionDeniedError(absl::StrCat(
          field, ": ", path, " resolves to ", resolved.string(),
          ", outside the directories this worker lets jobs use (--allow-root ",
          absl::StrJoin(roots, ", "), "): put the job's files under one of them"));
    }
  }
  return absl::OkStatus();
}

std::map<std::string, std::string> TrainerBaseEnv(char** environ,
                                                  const std::vector<std::string>& extra) {
  static const char* const kNames[] = {"PATH", "HOME",   "USER", "LOGNAME",        "LANG",
                                       "LANGUAGE", "TZ", "TMPDIR", "LD_LIBRARY_PATH"};
  static const char* const kPrefixes[] = {"LC_", "CUDA_", "NCCL_", "GLOO_", "NVIDIA_", "TORCH_"};
  std::map<std::string, std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) continue;
    const std::string name = kv.substr(0, eq);
    bool pass = false;
    for (const char* n : kNames) pass = pass || name == n;
    for (const char* p : kPrefixes) pass = pass || absl::StartsWith(name, p);
    for (const std::string& x : extra) {
      pass = pass || (absl::EndsWith(x, "*") ? absl::StartsWith(name, x.substr(0, x.size() - 1))
                                             : name == x);
    }
    if (pass) env[name] = kv.substr(eq + 1);
  }
  return env;
}

}  // namespace ddp
