#include "coordinator/rpc/request_limits.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/jobspec/job_spec.h"

namespace ddp {

absl::Status CheckSubmitRequest(const v1::SubmitJobRequest& r) {
  if (r.spec_yaml().size() > kMaxSpecBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the job file is ", r.spec_yaml().size(), " bytes; the limit is ",
                     kMaxSpecBytes, " bytes (spec size limit)"));
  }
  if (r.workdir().size() > kMaxPathBytes || r.source_name().size() > kMaxPathBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("workdir and source_name are limited to ", kMaxPathBytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status CheckReportEventsRequest(const v1::ReportEventsRequest& r) {
  if (r.events_size() > kMaxEventsPerBatch) {
    return absl::ResourceExhaustedError(absl::StrCat("a ReportEvents batch holds at most ",
                                                     kMaxEventsPerBatch, " events (got ",
                                                     r.events_size(), "): send smaller batches"));
  }
  return CheckWorkerName(r.worker());
}

absl::Status CheckWorkerName(const std::string& name) {
  const bool ok = !name.empty() && name.size() <= 253 &&
                  std::all_of(name.begin(), name.end(), [](char c) {
                    return absl::ascii_isalnum(c) || c == '.' || c == '-' || c == '_';
                  });
  if (!ok) {
    return absl::InvalidArgumentError(
        "worker names are 1-253 letters, digits, '.', '-' or '_' (set ddp-worker --name)");
  }
  return absl::OkStatus();
}

}  // namespace ddp
