#include "common/jobspec/tracking_spec.h"

#include "absl/strings/match.h"

namespace ddp::jobspec_internal {
namespace {

constexpr size_t kMaxExperimentBytes = 500;  // MLflow's own limit on a name.

bool IsHttpUri(const std::string& uri) {
  if (!absl::StartsWith(uri, "http://") && !absl::StartsWith(uri, "https://")) return false;
  const size_t host = uri.find("://") + 3;
  if (host >= uri.size() || uri[host] == '/') return false;
  for (char c : uri) {
    if (c == ' ' || c == '\t') return false;
  }
  return true;
}

void Uri(Reader& r, const YAML::Node& at, const std::string& path, const std::string& uri,
         TrackingSpec* t) {
  if (!IsHttpUri(uri)) {
    r.Error(at, path,
            absl::StrCat("'", uri, "' is not an MLflow tracking server's address: give "
                         "http://HOST:PORT or https://HOST:PORT (a path after it is kept)"));
    return;
  }
  t->mlflow_uri = uri;
  while (absl::EndsWith(t->mlflow_uri, "/")) t->mlflow_uri.pop_back();
}

}  // namespace

void ParseTracking(Reader& r, const YAML::Node& root, JobSpec* spec) {
  const YAML::Node n = r.Sub(root, "tracking");
  if (!n) return;
  if (!r.Map(n, "tracking", {"mlflow"})) return;
  const YAML::Node m = r.Sub(n, "mlflow");
  if (!m) return;
  TrackingSpec& t = spec->tracking;
  if (m.IsScalar()) {
    bool on;
    if (YAML::convert<bool>::decode(m, on)) {
      t.mlflow = on ? TrackingSpec::Mlflow::kOn : TrackingSpec::Mlflow::kOff;
      return;
    }
    std::string uri;
    if (r.String(n, "mlflow", "tracking", &uri, /*required=*/true)) {
      t.mlflow = TrackingSpec::Mlflow::kOn;
      Uri(r, m, "tracking.mlflow", uri, &t);
    }
    return;
  }
  if (!r.Map(m, "tracking.mlflow", {"uri", "experiment"})) return;
  t.mlflow = TrackingSpec::Mlflow::kOn;
  std::string uri;
  if (r.String(m, "uri", "tracking.mlflow", &uri) && !uri.empty()) {
    Uri(r, m["uri"], "tracking.mlflow.uri", uri, &t);
  }
  if (r.String(m, "experiment", "tracking.mlflow", &t.mlflow_experiment)) {
    if (t.mlflow_experiment.empty() || t.mlflow_experiment.size() > kMaxExperimentBytes) {
      r.Error(m["experiment"], "tracking.mlflow.experiment",
              absl::StrCat("must be 1 to ", kMaxExperimentBytes, " bytes (an MLflow experiment's name)"));
    }
  }
}

}  // namespace ddp::jobspec_internal
