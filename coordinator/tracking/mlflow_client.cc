#include "coordinator/tracking/mlflow_client.h"

#include <curl/curl.h>

#include <cmath>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/json_writer.h"
#include "google/protobuf/util/json_util.h"

namespace ddp::mlflow {
namespace {

size_t Append(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// JSON's doubles cannot say NaN or infinity; protobuf's JSON mapping (MLflow parses
// requests with it) takes them as these strings.
std::string MetricValue(double v) {
  if (std::isnan(v)) return "\"NaN\"";
  if (std::isinf(v)) return v > 0 ? "\"Infinity\"" : "\"-Infinity\"";
  return JsonNumber(v);
}

std::string KeyValueArray(const KeyValues& kvs) {
  std::vector<std::string> items;
  items.reserve(kvs.size());
  for (const auto& [k, v] : kvs) items.push_back(JsonObject().Add("key", k).Add("value", v).str());
  return JsonArray(items);
}

std::string Field(const google::protobuf::Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  return it == s.fields().end() ? "" : it->second.string_value();
}

const google::protobuf::Struct* Object(const google::protobuf::Struct& s, const std::string& key) {
  auto it = s.fields().find(key);
  if (it == s.fields().end() || !it->second.has_struct_value()) return nullptr;
  return &it->second.struct_value();
}

}  // namespace

Client::Client(std::string base_uri, absl::Duration timeout)
    : base_(std::move(base_uri)), timeout_(timeout) {
  static std::once_flag init;
  std::call_once(init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  curl_ = curl_easy_init();
}

Client::~Client() {
  if (curl_ != nullptr) curl_easy_cleanup(static_cast<CURL*>(curl_));
}

absl::StatusOr<google::protobuf::Struct> Client::Call(const std::string& path,
                                                      const std::string& body) {
  CURL* curl = static_cast<CURL*>(curl_);
  if (curl == nullptr) return absl::InternalError("libcurl could not make a handle");
  const std::string url = base_ + path;
  std::string answer;
  curl_easy_reset(curl);
  curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
  // Only the server the operator named: no redirects elsewhere, no other schemes.
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(absl::ToInt64Milliseconds(timeout_)));
  curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(timeout_)));
  curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Append);
  curl_easy_setopt(curl, CURLOPT_WRITEDATA, &answer);
  struct curl_slist* headers = curl_slist_append(nullptr, "Content-Type: application/json");
  curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
  if (!body.empty()) {
    curl_easy_setopt(curl, CURLOPT_POST, 1L);
    curl_easy_setopt(curl, CURLOPT_POSTFIELDS, body.c_str());
    curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE, static_cast<long>(body.size()));
  }
  const CURLcode rc = curl_easy_perform(curl);
  curl_slist_free_all(headers);
  if (rc != CURLE_OK) {
    return absl::UnavailableError(
        absl::StrCat("MLflow at ", base_, ": ", path, ": ", curl_easy_strerror(rc)));
  }
  long code = 0;
  curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &code);
  google::protobuf::Struct json;
  const bool parsed = !answer.empty() &&
                      google::protobuf::util::JsonStringToMessage(answer, &json).ok();
  if (code == 200 && parsed) return json;
  if (code == 200 && answer.empty()) return json;
  const std::string what =
      absl::StrCat("MLflow at ", base_, ": ", path, ": HTTP ", code,
                   parsed && !Field(json, "message").empty()
                       ? absl::StrCat(": ", Field(json, "message"))
                       : absl::StrCat(": ", answer.substr(0, 200)));
  if (code == 429 || code >= 500 || code == 0) return absl::UnavailableError(what);
  if (code == 200) return absl::UnavailableError(absl::StrCat(what, " (not JSON)"));
  const std::string error_code = parsed ? Field(json, "error_code") : "";
  if (error_code == "RESOURCE_DOES_NOT_EXIST" || code == 404) return absl::NotFoundError(what);
  if (error_code == "RESOURCE_ALREADY_EXISTS") return absl::AlreadyExistsError(what);
  if (code == 401 || code == 403) return absl::PermissionDeniedError(what);
  return absl::InvalidArgumentError(what);
}

absl::StatusOr<std::string> Client::Escape(const std::string& text) {
  CURL* curl = static_cast<CURL*>(curl_);
  char* escaped = curl ? curl_easy_escape(curl, text.c_str(), static_cast<int>(text.size()))
                       : nullptr;
  if (escaped == nullptr) return absl::InternalError("libcurl could not escape a name");
  std::string out(escaped);
  curl_free(escaped);
  return out;
}

absl::StatusOr<std::string> Client::ExperimentId(const std::string& name) {
  auto query = Escape(name);
  if (!query.ok()) return query.status();
  auto got = Call("/api/2.0/mlflow/experiments/get-by-name?experiment_name=" + *query, "");
  if (got.ok()) {
    const google::protobuf::Struct* e = Object(*got, "experiment");
    if (e != nullptr && !Field(*e, "experiment_id").empty()) {
      if (Field(*e, "lifecycle_stage") == "deleted") {
        return absl::FailedPreconditionError(absl::StrCat(
            "MLflow at ", base_, ": experiment '", name,
            "' is deleted: restore it (mlflow experiments restore) or name another"));
      }
      return Field(*e, "experiment_id");
    }
  } else if (got.status().code() != absl::StatusCode::kNotFound) {
    return got.status();
  }
  auto made = Call("/api/2.0/mlflow/experiments/create", JsonObject().Add("name", name).str());
  if (made.status().code() == absl::StatusCode::kAlreadyExists) {
    return ExperimentId(name);  // Made meanwhile by someone else.
  }
  if (!made.ok()) return made.status();
  return Field(*made, "experiment_id");
}

absl::StatusOr<Client::FoundRun> Client::FindRun(const std::string& experiment_id,
                                                 const std::string& key,
                                                 const std::string& value) {
  // MLflow's search filter: a backquoted key, a single-quoted value.
  std::string quoted;
  for (char c : value) {
    if (c == '\'' || c == '\\') quoted += '\\';
    quoted += c;
  }
  const std::string body =
      JsonObject()
          .AddRaw("experiment_ids", JsonArray({absl::StrCat("\"", JsonEscape(experiment_id), "\"")}))
          .Add("filter", absl::StrCat("tags.`", key, "` = '", quoted, "'"))
          .Add("max_results", 1)
          .AddRaw("order_by", JsonArray({"\"attributes.start_time DESC\""}))
          .str();
  auto found = Call("/api/2.0/mlflow/runs/search", body);
  if (!found.ok()) return found.status();
  auto runs = found->fields().find("runs");
  if (runs == found->fields().end() || runs->second.list_value().values_size() == 0) {
    return FoundRun{};
  }
  const auto& run = runs->second.list_value().values(0).struct_value();
  const google::protobuf::Struct* info = Object(run, "info");
  if (info == nullptr) return FoundRun{};
  return FoundRun{Field(*info, "run_id"), Field(*info, "status")};
}

absl::StatusOr<int64_t> Client::MetricCount(const std::string& run_id, const std::string& key) {
  auto run = Escape(run_id);
  if (!run.ok()) return run.status();
  auto metric = Escape(key);
  if (!metric.ok()) return metric.status();
  int64_t count = 0;
  std::string token;
  // At most 25,000 a page (the server refuses more).
  do {
    std::string path = absl::StrCat("/api/2.0/mlflow/metrics/get-history?run_id=", *run,
                                    "&metric_key=", *metric, "&max_results=25000");
    if (!token.empty()) {
      auto t = Escape(token);
      if (!t.ok()) return t.status();
      absl::StrAppend(&path, "&page_token=", *t);
    }
    auto page = Call(path, "");
    if (!page.ok()) return page.status();
    auto metrics = page->fields().find("metrics");
    if (metrics != page->fields().end()) count += metrics->second.list_value().values_size();
    token = Field(*page, "next_page_token");
  } while (!token.empty());
  return count;
}

absl::StatusOr<std::string> Client::CreateRun(const std::string& experiment_id,
                                              const std::string& run_name, int64_t start_ms,
                                              const KeyValues& tags) {
  auto made = Call("/api/2.0/mlflow/runs/create", JsonObject()
                                                      .Add("experiment_id", experiment_id)
                                                      .Add("run_name", run_name)
                                                      .Add("start_time", start_ms)
                                                      .AddRaw("tags", KeyValueArray(tags))
                                                      .str());
  if (!made.ok()) return made.status();
  const google::protobuf::Struct* run = Object(*made, "run");
  const google::protobuf::Struct* info = run ? Object(*run, "info") : nullptr;
  if (info == nullptr || Field(*info, "run_id").empty()) {
    return absl::UnavailableError(
        absl::StrCat("MLflow at ", base_, ": runs/create answered without a run id"));
  }
  return Field(*info, "run_id");
}

absl::Status Client::LogBatch(const std::string& run_id, const std::vector<Metric>& metrics,
                              const KeyValues& params, const KeyValues& tags) {
  std::vector<std::string> items;
  items.reserve(metrics.size());
  for (const Metric& m : metrics) {
    items.push_back(absl::StrCat("{\"key\":\"", JsonEscape(m.key), "\",\"value\":",
                                 MetricValue(m.value), ",\"timestamp\":", m.timestamp_ms,
                                 ",\"step\":", m.step, "}"));
  }
  return Call("/api/2.0/mlflow/runs/log-batch", JsonObject()
                                                    .Add("run_id", run_id)
                                                    .AddRaw("metrics", JsonArray(items))
                                                    .AddRaw("params", KeyValueArray(params))
                                                    .AddRaw("tags", KeyValueArray(tags))
                                                    .str())
      .status();
}

absl::Status Client::EndRun(const std::string& run_id, const std::string& status,
                            int64_t end_ms) {
  return Call("/api/2.0/mlflow/runs/update", JsonObject()
                                                 .Add("run_id", run_id)
                                                 .Add("status", status)
                                                 .Add("end_time", end_ms)
                                                 .str())
      .status();
}

}  // namespace ddp::mlflow
