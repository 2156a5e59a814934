#include "common/jobspec/job_spec.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/contract/launch_env.h"
#include "common/jobspec/command_spec.h"
#include "common/jobspec/tracking_spec.h"
#include "common/jobspec/job_text.h"
#include "common/jobspec/yaml_reader.h"
#include "yaml-cpp/yaml.h"

namespace ddp {
namespace {

using jobspec_internal::AtMost;
using jobspec_internal::CheckKind;
using jobspec_internal::NonNegative;
using jobspec_internal::ParseCommand;
using jobspec_internal::Positive;
using jobspec_internal::Reader;
using jobspec_internal::SecondDocumentLine;

bool ValidName(const std::string& s) {
  if (s.empty() || s.size() > 63 || !absl::ascii_isalnum(s[0])) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.';
  });
}

void Seed(Reader& r, const YAML::Node& map, const std::string& path, int64_t* seed) {
  if (r.Int(map, "seed", path, seed) && (*seed > kMaxSeed || *seed < -kMaxSeed)) {
    r.Error(map["seed"], Reader::Join(path, "seed"),
            absl::StrCat("must be within +-", kMaxSeed, " (got ", *seed, ")"));
  }
}

void ParseNodes(Reader& r, const YAML::Node& root, JobSpec* spec) {
  const YAML::Node n = root["nodes"];
  if (!n) return;
  r.Touch(n);
  if (!n.IsScalar()) {
    r.Error(n, "nodes", "expected a count such as 2 or a range such as \"1:4\"");
    return;
  }
  std::vector<std::string> parts = absl::StrSplit(n.Scalar(), ':');
  int lo = 0, hi = 0;
  bool ok = false;
  if (parts.size() == 1) {
    ok = absl::SimpleAtoi(parts[0], &lo);
    hi = lo;
  } else if (parts.size() == 2) {
    ok = absl::SimpleAtoi(parts[0], &lo) && absl::SimpleAtoi(parts[1], &hi);
  }
  if (!ok) {
    r.Error(n, "nodes", absl::StrCat("expected a count such as 2 or a range such as \"1:4\", got '",
                                     n.Scalar(), "'"));
    return;
  }
  if (lo < 1 || hi < lo || hi > kMaxNodes) {
    r.Error(n, "nodes",
            hi > kMaxNodes
                ? absl::StrCat("at most ", kMaxNodes, " nodes (got ", n.Scalar(), ")")
                : absl::StrCat("need 1 <= min <= max (got ", n.Scalar(), ")"));
    return;
  }
  spec->nodes = {lo, hi};
}

// priority, node_selector, preemption (docs/scheduling.md).
void ParseScheduling(Reader& r, const YAML::Node& root, JobSpec* spec) {
  if (r.Int(root, "priority", "", &spec->priority) &&
      (spec->priority < -kMaxPriority || spec->priority > kMaxPriority)) {
    r.Error(root["priority"], "priority",
            absl::StrCat("must be -", kMaxPriority, "..", kMaxPriority, " (got ",
                         spec->priority, ")"));
  }
  if (const YAML::Node sel = r.Sub(root, "node_selector")) {
    if (!sel.IsMap()) {
      r.Error(sel, "node_selector", "expected a mapping of label: value (e.g. pool: team-a)");
    } else if (sel.size() > kMaxLabels) {
      r.Error(sel, "node_selector",
              absl::StrCat("at most ", kMaxLabels, " labels (got ", sel.size(), ")"));
    } else {
      std::map<std::string, int> seen;
      for (const auto& kv : sel) {
        std::string key;
        if (!r.Key(kv.first, "node_selector", &key)) continue;
        const std::string field = absl::StrCat("node_selector.", key);
        if (!r.Unique(kv.first, field, &seen)) continue;
        if (!ValidLabelKey(key)) {
          r.Error(kv.first, field,
                  "a label key is 1-63 letters, digits, '.', '_', '-' or '/', starting with a "
                  "letter or digit");
          continue;
        }
        if (!kv.second.IsScalar() || !ValidLabelValue(kv.second.Scalar())) {
          r.Error(kv.second, field, "a label value is 0-63 letters, digits, '.', '_' or '-'");
          continue;
        }
        spec->node_selector[key] = kv.second.Scalar();
      }
    }
  }
  std::string preemption;
  if (r.String(root, "preemption", "", &preemption)) {
    if (preemption == "at_checkpoint") {
      spec->preemption = PreemptionPolicy::kAtCheckpoint;
    } else if (preemption == "kill") {
      spec->preemption = PreemptionPolicy::kKill;
    } else if (preemption == "never") {
      spec->preemption = PreemptionPolicy::kNever;
    } else {
      r.Error(root["preemption"], "preemption",
              absl::StrCat("must be at_checkpoint, kill or never (got '", preemption, "')"));
    }
  }
  if (r.Double(root, "preemption_notice_s", "", &spec->preemption_notice_s)) {
    if (spec->preemption_notice_s < 0 || spec->preemption_notice_s > kMaxPreemptionNoticeS) {
      r.Error(root["preemption_notice_s"], "preemption_notice_s",
              absl::StrCat("must be 0 to ", kMaxPreemptionNoticeS, " seconds (got ",
                           spec->preemption_notice_s, ")"));
    } else if (spec->preemption_notice_s > 0 && spec->preemption != PreemptionPolicy::kKill) {
      r.Error(root["preemption_notice_s"], "preemption_notice_s",
              "only with `preemption: kill` (an at_checkpoint job is always asked for a "
              "checkpoint and waited for; a `never` job is not preempted)");
    }
  }
}

void ParseTop(Reader& r, const YAML::Node& root, JobSpec* spec) {
  if (r.String(root, "name", "", &spec->name, /*required=*/true) && !ValidName(spec->name)) {
    r.Error(root["name"], "name",
            "use 1-63 letters, digits, '-', '_' or '.', starting with a letter or digit");
  }
  if (r.String(root, "rdzv_id", "", &spec->rdzv_id) && !ValidName(spec->rdzv_id)) {
    r.Error(root["rdzv_id"], "rdzv_id",
            "use 1-63 letters, digits, '-', '_' or '.', starting with a letter or digit");
  }
  ParseNodes(r, root, spec);
  if (const YAML::Node n = root["nproc_per_node"]; n && n.IsScalar() && n.Scalar() == "auto") {
    spec->nproc_per_node = 0;
  } else if (r.Int(root, "nproc_per_node", "", &spec->nproc_per_node) &&
             (spec->nproc_per_node < 1 || spec->nproc_per_node > kMaxProcPerNode)) {
    r.Error(root["nproc_per_node"], "nproc_per_node",
            absl::StrCat("must be 1..", kMaxProcPerNode, " or auto (got ", spec->nproc_per_node,
                         ")"));
  }
  std::string backend;
  if (r.String(root, "backend", "", &backend)) {
    if (backend == "auto") {
      spec->backend = Backend::kAuto;
    } else if (backend == "nccl") {
      spec->backend = Backend::kNccl;
    } else if (backend == "gloo") {
      spec->backend = Backend::kGloo;
    } else {
      r.Error(root["backend"], "backend",
              absl::StrCat("must be auto, nccl or gloo (got '", backend, "')"));
    }
  }
  ParseScheduling(r, root, spec);
  if (r.Int(root, "max_restarts", "", &spec->max_restarts)) {
    NonNegative(r, root, "max_restarts", "", spec->max_restarts);
    AtMost(r, root, "max_restarts", "", int64_t{spec->max_restarts}, kMaxRestarts);
  }
  if (r.Int(root, "max_recoveries", "", &spec->max_recoveries)) {
    NonNegative(r, root, "max_recoveries", "", spec->max_recoveries);
    AtMost(r, root, "max_recoveries", "", int64_t{spec->max_recoveries}, kMaxRestarts);
  }
  if (r.Double(root, "stop_grace_s", "", &spec->stop_grace_s)) {
    NonNegative(r, root, "stop_grace_s", "", spec->stop_grace_s);
    AtMost(r, root, "stop_grace_s", "", spec->stop_grace_s, kMaxRecoveryTimeoutS);
  }
  if (r.Double(root, "recovery_timeout_s", "", &spec->recovery_timeout_s)) {
    Positive(r, root, "recovery_timeout_s", "", spec->recovery_timeout_s);
    AtMost(r, root, "recovery_timeout_s", "", spec->recovery_timeout_s, kMaxRecoveryTimeoutS);
  }
  if (r.String(root, "workdir", "", &spec->workdir) && !spec->workdir.empty() &&
      spec->workdir[0] != '/') {
    r.Error(root["workdir"], "workdir", "must be an absolute path");
  }
  if (const YAML::Node env = r.Sub(root, "env")) {
    if (!env.IsMap()) {
      r.Error(env, "env", "expected a mapping of NAME: value");
    } else if (env.size() > kMaxEnvEntries) {
      r.Error(env, "env", absl::StrCat("at most ", kMaxEnvEntries, " variables (got ",
                                       env.size(), ")"));
    } else {
      std::map<std::string, int> seen;
      for (const auto& kv : env) {
        std::string k;
        if (!r.Key(kv.first, "env", &k)) continue;
        if (!r.Unique(kv.first, absl::StrCat("env.", k), &seen)) continue;
        bool ok = !k.empty() && !absl::ascii_isdigit(k[0]) &&
                  std::all_of(k.begin(), k.end(),
                              [](char c) { return absl::ascii_isalnum(c) || c == '_'; });
        if (!ok || !kv.second.IsScalar()) {
          r.Error(kv.first, absl::StrCat("env.", k),
                  "expected NAME: value with NAME of letters, digits and '_'");
          continue;
        }
        const std::vector<std::string>& reserved = ContractEnvNames();
        if (std::find(reserved.begin(), reserved.end(), k) != reserved.end()) {
          r.Error(kv.first, absl::StrCat("env.", k), "is set by ddp and cannot be overridden");
          continue;
        }
        // The dynamic loader's and glibc's variables would change what code the
        // trainer runs, not how it trains.
        if (absl::StartsWith(k, "LD_") || k == "GCONV_PATH" || k == "GLIBC_TUNABLES") {
          r.Error(kv.first, absl::StrCat("env.", k),
                  "loader variables (LD_*, GCONV_PATH, GLIBC_TUNABLES) cannot be set by a job");
          continue;
        }
        const std::string& value = kv.second.Scalar();
        if (value.size() > kMaxStringBytes || HasControlCharacter(value)) {
          r.Error(kv.second, absl::StrCat("env.", k),
                  absl::StrCat("values are at most ", kMaxStringBytes,
                               " bytes without control characters"));
          continue;
        }
        spec->env[k] = value;
      }
    }
  }
}

// model.gpt: GPT-2's shape, each field bounded, the whole at most kMaxGptParameters.
void ParseGpt(Reader& r, const YAML::Node& n, GptSpec* g) {
  if (n.IsNull()) return;  // `gpt:` alone: GPT-2 124M.
  const std::string path = "model.gpt";
  if (!r.Map(n, path, {"layers", "heads", "dim", "seq_len", "vocab", "dropout", "tie_weights"})) {
    return;
  }
  bool in_bounds = true;
  auto count = [&](const char* key, int64_t* v, int64_t lo, int64_t hi) {
    if (!r.Int(n, key, path, v)) return;
    if (*v < lo || *v > hi) {
      r.Error(n[key], absl::StrCat(path, ".", key),
              absl::StrCat("must be ", lo, "..", hi, " (got ", *v, ")"));
      in_bounds = false;
    }
  };
  count("layers", &g->layers, 1, kMaxGptLayers);
  count("heads", &g->heads, 1, kMaxGptHeads);
  count("dim", &g->dim, 1, kMaxWidth);
  count("seq_len", &g->seq_len, 1, kMaxSeqLen);
  count("vocab", &g->vocab, 2, kMaxVocab);
  if (r.Double(n, "dropout", path, &g->dropout) && (g->dropout < 0 || g->dropout >= 1)) {
    r.Error(n["dropout"], path + ".dropout",
            absl::StrCat("must be in [0, 1) (got ", g->dropout, ")"));
  }
  r.Bool(n, "tie_weights", path, &g->tie_weights);
  if (!in_bounds) return;
  if (g->dim % g->heads != 0) {
    r.Error(n["dim"] ? n["dim"] : n["heads"], path + ".dim",
            absl::StrCat("must be a multiple of model.gpt.heads (got dim ", g->dim, ", heads ",
                         g->heads, "): each head attends over dim / heads channels"));
  }
  if (const int64_t params = GptParameterCount(*g); params > kMaxGptParameters) {
    r.Error(n, path,
            absl::StrCat("has ", params, " parameters (layers ", g->layers, ", dim ", g->dim,
                         ", seq_len ", g->seq_len, ", vocab ", g->vocab,
                         g->tie_weights ? "" : ", untied head", "), more than the ",
                         kMaxGptParameters, " (2^40) a job may describe"));
  }
}

void ParseModel(Reader& r, const YAML::Node& root, JobSpec* spec) {
  const YAML::Node model = r.Sub(root, "model");
  if (!model) {
    r.Error(root, "model", "is required (mlp, cnn, torchscript or gpt)");
    return;
  }
  if (!r.Map(model, "model", {"mlp", "cnn", "torchscript", "gpt"})) return;
  ModelSpec& m = spec->model;
  switch (r.OneOf(model, "model", {"mlp", "cnn", "torchscript", "gpt"})) {
    case 0: {
      m.kind = ModelSpec::Kind::kMlp;
      const YAML::Node n = model["mlp"];
      if (n.IsNull()) break;
      if (!r.Map(n, "model.mlp", {"hidden"})) break;
      if (r.IntList(n, "hidden", "model.mlp", &m.mlp.hidden)) {
        for (size_t i = 0; i < m.mlp.hidden.size(); ++i) {
          if (m.mlp.hidden[i] <= 0 || m.mlp.hidden[i] > kMaxWidth) {
            r.Error(n["hidden"][i], absl::StrCat("model.mlp.hidden[", i, "]"),
                    absl::StrCat(m.mlp.hidden[i] <= 0 ? "must be > 0" : "must be <= 65536",
                                 " (got ", m.mlp.hidden[i], ")"));
          }
        }
      }
      break;
    }
    case 1: {
      m.kind = ModelSpec::Kind::kCnn;
      const YAML::Node n = model["cnn"];
      if (n.IsNull()) break;
      if (!r.Map(n, "model.cnn", {"channels", "kernel", "hidden"})) break;
      if (r.IntList(n, "channels", "model.cnn", &m.cnn.channels)) {
        if (m.cnn.channels.empty()) r.Error(n["channels"], "model.cnn.channels", "must not be empty");
        for (size_t i = 0; i < m.cnn.channels.size(); ++i) {
          if (m.cnn.channels[i] <= 0 || m.cnn.channels[i] > kMaxWidth) {
            r.Error(n["channels"][i], absl::StrCat("model.cnn.channels[", i, "]"),
                    absl::StrCat(m.cnn.channels[i] <= 0 ? "must be > 0" : "must be <= 65536",
                                 " (got ", m.cnn.channels[i], ")"));
          }
        }
      }
      if (r.Int(n, "kernel", "model.cnn", &m.cnn.kernel) &&
          (m.cnn.kernel <= 0 || m.cnn.kernel % 2 == 0 || m.cnn.kernel > 63)) {
        r.Error(n["kernel"], "model.cnn.kernel",
                absl::StrCat("must be an odd number 1..63 (got ", m.cnn.kernel, ")"));
      }
      if (r.Int(n, "hidden", "model.cnn", &m.cnn.hidden)) {
        Positive(r, n, "hidden", "model.cnn", m.cnn.hidden);
        AtMost(r, n, "hidden", "model.cnn", m.cnn.hidden, kMaxWidth);
      }
      break;
    }
    case 2: {
      m.kind = ModelSpec::Kind::kTorchScript;
      const YAML::Node n = model["torchscript"];
      if (!r.Map(n, "model.torchscript", {"path"})) break;
      r.String(n, "path", "model.torchscript", &m.torchscript.path, /*required=*/true);
      break;
    }
    case 3:
      m.kind = ModelSpec::Kind::kGpt;
      ParseGpt(r, model["gpt"], &m.gpt);
      break;
    default:
      break;
  }
}

void ParseTokens(Reader& r, const YAML::Node& n, const std::string& path, TokensSpec* t) {
  if (!r.Map(n, path, {"path", "dtype"})) return;
  r.String(n, "path", path, &t->path, /*required=*/true);
  std::string dtype;
  if (r.String(n, "dtype", path, &dtype)) {
    if (dtype == "uint16") {
      t->dtype = TokenDtype::kUint16;
    } else if (dtype == "uint32") {
      t->dtype = TokenDtype::kUint32;
    } else {
      r.Error(n["dtype"], path + ".dtype",
              absl::StrCat("must be uint16 or uint32 (got '", dtype,
                           "'): the width of each little-endian token id in the file"));
    }
  }
}

void ParseIdx(Reader& r, const YAML::Node& n, const std::string& path, IdxSpec* idx) {
  if (!r.Map(n, path, {"images", "labels"})) return;
  r.String(n, "images", path, &idx->images, /*required=*/true);
  r.String(n, "labels", path, &idx->labels, /*required=*/true);
}

void ParseData(Reader& r, const YAML::Node& root, JobSpec* spec) {
  const YAML::Node data = r.Sub(root, "data");
  if (!data) {
    r.Error(root, "data", "is required (csv, idx, synthetic or tokens)");
    return;
  }
  if (!r.Map(data, "data", {"csv", "idx", "synthetic", "tokens", "validation", "seed"})) return;
  DataSpec& d = spec->data;
  switch (r.OneOf(data, "data", {"csv", "idx", "synthetic", "tokens"})) {
    case 0: {
      d.kind = DataSpec::Kind::kCsv;
      const YAML::Node n = data["csv"];
      if (!r.Map(n, "data.csv", {"path", "skip_rows", "label_column", "standardize"})) break;
      r.String(n, "path", "data.csv", &d.csv.path, /*required=*/true);
      if (r.Int(n, "skip_rows", "data.csv", &d.csv.skip_rows)) {
        NonNegative(r, n, "skip_rows", "data.csv", d.csv.skip_rows);
        AtMost(r, n, "skip_rows", "data.csv", d.csv.skip_rows, kMaxRows);
      }
      if (r.Int(n, "label_column", "data.csv", &d.csv.label_column) &&
          (d.csv.label_column > kMaxFeatures || d.csv.label_column < -kMaxFeatures)) {
        r.Error(n["label_column"], "data.csv.label_column",
                absl::StrCat("must be within +-", kMaxFeatures, " (got ", d.csv.label_column, ")"));
      }
      r.Bool(n, "standardize", "data.csv", &d.csv.standardize);
      break;
    }
    case 1:
      d.kind = DataSpec::Kind::kIdx;
      ParseIdx(r, data["idx"], "data.idx", &d.idx);
      break;
    case 2: {
      d.kind = DataSpec::Kind::kSynthetic;
      const YAML::Node n = data["synthetic"];
      if (n.IsNull()) break;
      if (!r.Map(n, "data.synthetic", {"samples", "features", "classes"})) break;
      if (r.Int(n, "samples", "data.synthetic", &d.synthetic.samples)) {
        Positive(r, n, "samples", "data.synthetic", d.synthetic.samples);
        AtMost(r, n, "samples", "data.synthetic", d.synthetic.samples, kMaxRows);
      }
      if (r.Int(n, "features", "data.synthetic", &d.synthetic.features)) {
        Positive(r, n, "features", "data.synthetic", d.synthetic.features);
        AtMost(r, n, "features", "data.synthetic", d.synthetic.features, kMaxFeatures);
      }
      if (r.Int(n, "classes", "data.synthetic", &d.synthetic.classes) &&
          (d.synthetic.classes < 2 || d.synthetic.classes > kMaxFeatures)) {
        r.Error(n["classes"], "data.synthetic.classes",
                absl::StrCat("must be 2..", kMaxFeatures, " (got ", d.synthetic.classes, ")"));
      }
      // Divided, not multiplied: either may be far over its own bound (reported above,
      // but not clamped), and the product must not overflow.
      if (d.synthetic.samples > 0 && d.synthetic.features > 0 &&
          d.synthetic.samples > kMaxSyntheticValues / d.synthetic.features) {
        r.Error(n, "data.synthetic",
                absl::StrCat("samples * features must be <= ", kMaxSyntheticValues, " (got ",
                             d.synthetic.samples, " * ", d.synthetic.features, ")"));
      }
      break;
    }
    case 3:
      d.kind = DataSpec::Kind::kTokens;
      ParseTokens(r, data["tokens"], "data.tokens", &d.tokens);
      break;
    default:
      break;
  }
  if (const YAML::Node v = r.Sub(data, "validation")) {
    if (r.Map(v, "data.validation", {"fraction", "idx", "tokens"})) {
      if (r.Double(v, "fraction", "data.validation", &d.validation.fraction) &&
          (d.validation.fraction < 0 || d.validation.fraction >= 1)) {
        r.Error(v["fraction"], "data.validation.fraction",
                absl::StrCat("must be in [0, 1) (got ", d.validation.fraction, ")"));
      }
      if (v["idx"]) {
        d.validation.has_idx = true;
        ParseIdx(r, v["idx"], "data.validation.idx", &d.validation.idx);
        if (v["fraction"]) {
          r.Error(v["idx"], "data.validation", "give only one of fraction and idx");
        }
        if (d.kind != DataSpec::Kind::kIdx) {
          r.Error(v["idx"], "data.validation.idx", "needs data.idx training data");
        }
      }
      if (v["tokens"]) {
        d.validation.has_tokens = true;
        // The validation file's ids are as wide as the training file's unless it says.
        d.validation.tokens.dtype = d.tokens.dtype;
        ParseTokens(r, v["tokens"], "data.validation.tokens", &d.validation.tokens);
        if (v["fraction"] || v["idx"]) {
          r.Error(v["tokens"], "data.validation",
                  v["idx"] ? "give only one of idx and tokens"
                           : "give only one of fraction and tokens");
        }
        if (d.kind != DataSpec::Kind::kTokens) {
          r.Error(v["tokens"], "data.validation.tokens", "needs data.tokens training data");
        }
      }
      // Windows of a token stream are not rows to hold out at random: nanoGPT's
      // validation is a second file (val.bin).
      if (v["fraction"] && d.kind == DataSpec::Kind::kTokens) {
        r.Error(v["fraction"], "data.validation.fraction",
                "is not for data.tokens: give the validation tokens as a second file, "
                "data.validation: {tokens: {path: val.bin}}");
      }
    }
  }
  Seed(r, data, "data", &d.seed);
}

void ParseLrSchedule(Reader& r, const YAML::Node& train, TrainSpec* t) {
  const YAML::Node n = r.Sub(train, "lr_schedule");
  if (!n) return;
  const std::string path = "train.lr_schedule";
  if (!r.Map(n, path,
             {"name", "interval", "warmup", "warmup_start_factor", "step_size", "gamma", "t_max",
              "eta_min", "end_factor"})) {
    return;
  }
  LrSchedule& s = t->lr_schedule;
  std::string name;
  if (r.String(n, "name", path, &name, /*required=*/true)) {
    if (name == "constant") {
      s.kind = LrSchedule::Kind::kConstant;
    } else if (name == "step") {
      s.kind = LrSchedule::Kind::kStep;
    } else if (name == "cosine") {
      s.kind = LrSchedule::Kind::kCosine;
    } else if (name == "linear") {
      s.kind = LrSchedule::Kind::kLinear;
    } else {
      r.Error(n["name"], path + ".name",
              absl::StrCat("must be step, cosine, linear or constant (got '", name, "')"));
    }
  }
  std::string interval;
  if (r.String(n, "interval", path, &interval)) {
    if (interval == "step") {
      s.interval = LrSchedule::Interval::kStep;
    } else if (interval == "epoch") {
      s.interval = LrSchedule::Interval::kEpoch;
    } else {
      r.Error(n["interval"], path + ".interval",
              absl::StrCat("must be step (every optimizer step) or epoch (got '", interval, "')"));
    }
  }
  if (r.Int(n, "warmup", path, &s.warmup)) {
    NonNegative(r, n, "warmup", path, s.warmup);
    AtMost(r, n, "warmup", path, s.warmup, kMaxSteps);
  }
  if (r.Double(n, "warmup_start_factor", path, &s.warmup_start_factor) &&
      (s.warmup_start_factor <= 0 || s.warmup_start_factor > 1)) {
    r.Error(n["warmup_start_factor"], path + ".warmup_start_factor",
            absl::StrCat("must be in (0, 1] (got ", s.warmup_start_factor, ")"));
  }
  // Each knob belongs to one schedule: naming it for another is a mistake to report.
  auto only_for = [&](const char* key, LrSchedule::Kind kind, const char* which) {
    if (n[key] && s.kind != kind) {
      r.Error(n[key], absl::StrCat(path, ".", key), absl::StrCat("applies to name: ", which, " only"));
      return false;
    }
    return true;
  };
  if (only_for("step_size", LrSchedule::Kind::kStep, "step") &&
      r.Int(n, "step_size", path, &s.step_size)) {
    Positive(r, n, "step_size", path, s.step_size);
    AtMost(r, n, "step_size", path, s.step_size, kMaxSteps);
  }
  if (only_for("gamma", LrSchedule::Kind::kStep, "step") && r.Double(n, "gamma", path, &s.gamma)) {
    Positive(r, n, "gamma", path, s.gamma);
    AtMost(r, n, "gamma", path, s.gamma, 1.0);
  }
  if (only_for("eta_min", LrSchedule::Kind::kCosine, "cosine") &&
      r.Double(n, "eta_min", path, &s.eta_min)) {
    NonNegative(r, n, "eta_min", path, s.eta_min);
    AtMost(r, n, "eta_min", path, s.eta_min, kMaxOptimizerValue);
  }
  if (only_for("end_factor", LrSchedule::Kind::kLinear, "linear") &&
      r.Double(n, "end_factor", path, &s.end_factor) && (s.end_factor < 0 || s.end_factor > 1)) {
    r.Error(n["end_factor"], path + ".end_factor",
            absl::StrCat("must be in [0, 1] (got ", s.end_factor, ")"));
  }
  if (n["t_max"] && s.kind != LrSchedule::Kind::kCosine &&
      s.kind != LrSchedule::Kind::kLinear) {
    r.Error(n["t_max"], path + ".t_max", "applies to name: cosine and linear only");
  } else if (r.Int(n, "t_max", path, &s.t_max)) {
    NonNegative(r, n, "t_max", path, s.t_max);
    AtMost(r, n, "t_max", path, s.t_max, kMaxSteps);
  }
}

void ParseOptimizer(Reader& r, const YAML::Node& train, TrainSpec* t) {
  const YAML::Node n = r.Sub(train, "optimizer");
  if (!n) return;  // Adam, lr 1e-3.
  if (!r.Map(n, "train.optimizer",
             {"name", "lr", "momentum", "nesterov", "weight_decay", "betas", "eps", "amsgrad",
              "zero_redundancy", "fused", "weight_decay_params"})) {
    return;
  }
  OptimizerSpec& o = t->optimizer;
  std::string name;
  if (r.String(n, "name", "train.optimizer", &name, /*required=*/true)) {
    if (name == "sgd") {
      o.kind = OptimizerKind::kSgd;
    } else if (name == "adam") {
      o.kind = OptimizerKind::kAdam;
    } else if (name == "adamw") {
      o.kind = OptimizerKind::kAdamW;
      o.weight_decay = 1e-2;  // torch.optim.AdamW's default.
    } else {
      r.Error(n["name"], "train.optimizer.name",
              absl::StrCat("must be sgd, adam or adamw (got '", name, "')"));
    }
  }
  bool has_lr = r.Double(n, "lr", "train.optimizer", &o.lr);
  if (has_lr) {
    Positive(r, n, "lr", "train.optimizer", o.lr);
    AtMost(r, n, "lr", "train.optimizer", o.lr, kMaxOptimizerValue);
  }
  if (!has_lr && o.kind == OptimizerKind::kSgd) {
    r.Error(n, "train.optimizer.lr", "is required for sgd");
  }
  if (r.Double(n, "momentum", "train.optimizer", &o.momentum)) {
    if (o.kind != OptimizerKind::kSgd) {
      r.Error(n["momentum"], "train.optimizer.momentum", "applies to sgd only (adam uses betas)");
    } else if (o.momentum < 0 || o.momentum >= 1) {
      r.Error(n["momentum"], "train.optimizer.momentum",
              absl::StrCat("must be in [0, 1) (got ", o.momentum, ")"));
    }
  }
  if (r.Bool(n, "nesterov", "train.optimizer", &o.nesterov) && o.nesterov &&
      (o.kind != OptimizerKind::kSgd || o.momentum <= 0)) {
    r.Error(n["nesterov"], "train.optimizer.nesterov", "needs sgd with momentum > 0");
  }
  if (r.Double(n, "weight_decay", "train.optimizer", &o.weight_decay)) {
    NonNegative(r, n, "weight_decay", "train.optimizer", o.weight_decay);
    AtMost(r, n, "weight_decay", "train.optimizer", o.weight_decay, kMaxOptimizerValue);
  }
  if (const YAML::Node b = n["betas"]) {
    r.Touch(b);
    if (o.kind == OptimizerKind::kSgd) {
      r.Error(b, "train.optimizer.betas", "applies to adam and adamw only");
    } else if (!b.IsSequence() || b.size() != 2 || !b[0].IsScalar() || !b[1].IsScalar() ||
               !absl::SimpleAtod(b[0].Scalar(), &o.beta1) ||
               !absl::SimpleAtod(b[1].Scalar(), &o.beta2)) {
      r.Error(b, "train.optimizer.betas", "expected two numbers such as [0.9, 0.999]");
    } else if (o.beta1 < 0 || o.beta1 >= 1 || o.beta2 < 0 || o.beta2 >= 1) {
      r.Error(b, "train.optimizer.betas", "each beta must be in [0, 1)");
    }
  }
  if (r.Double(n, "eps", "train.optimizer", &o.eps)) {
    Positive(r, n, "eps", "train.optimizer", o.eps);
    AtMost(r, n, "eps", "train.optimizer", o.eps, kMaxOptimizerValue);
  }
  if (r.Bool(n, "amsgrad", "train.optimizer", &o.amsgrad) && o.amsgrad &&
      o.kind == OptimizerKind::kSgd) {
    r.Error(n["amsgrad"], "train.optimizer.amsgrad", "applies to adam and adamw only");
  }
  r.Bool(n, "zero_redundancy", "train.optimizer", &o.zero_redundancy);
  int fused = 2;
  if (r.BoolOrWord(n, "fused", "train.optimizer", "auto", &fused)) {
    o.fused = fused == 2 ? FusedPolicy::kAuto
                         : (fused == 1 ? FusedPolicy::kTrue : FusedPolicy::kFalse);
  }
  std::string decay;
  if (r.String(n, "weight_decay_params", "train.optimizer", &decay)) {
    if (decay == "all") {
      o.weight_decay_params = WeightDecayParams::kAll;
    } else if (decay == "matrices") {
      o.weight_decay_params = WeightDecayParams::kMatrices;
    } else {
      r.Error(n["weight_decay_params"], "train.optimizer.weight_decay_params",
              absl::StrCat("must be all or matrices (parameters of 2 or more dimensions "
                           "decay, biases and norm weights do not) (got '", decay, "')"));
    }
  }
}

// train.comm_hook and train.powersgd: PyTorch's fp16/bf16_compress_hook and powerSGD_hook.
void ParseCommHook(Reader& r, const YAML::Node& train, TrainSpec* t) {
  std::string hook;
  if (r.String(train, "comm_hook", "train", &hook)) {
    if (hook == "none") {
      t->comm_hook = CommHookKind::kNone;
    } else if (hook == "fp16") {
      t->comm_hook = CommHookKind::kFp16;
    } else if (hook == "bf16") {
      t->comm_hook = CommHookKind::kBf16;
    } else if (hook == "powersgd") {
      t->comm_hook = CommHookKind::kPowerSgd;
    } else {
      r.Error(train["comm_hook"], "train.comm_hook",
              absl::StrCat("must be none, fp16, bf16 or powersgd (got '", hook, "')"));
    }
  }
  const YAML::Node n = r.Sub(train, "powersgd");
  if (!n) return;
  const std::string path = "train.powersgd";
  if (t->comm_hook != CommHookKind::kPowerSgd) {
    r.Error(n, path, "is for comm_hook: powersgd only: set train.comm_hook: powersgd or drop it");
    return;
  }
  if (!r.Map(n, path,
             {"rank", "start_iteration", "min_compression_rate", "error_feedback", "warm_start",
              "orthogonalization_epsilon", "random_seed", "batch_tensors_with_same_shape"})) {
    return;
  }
  PowerSgdSpec& p = t->powersgd;
  if (r.Int(n, "rank", path, &p.rank)) {
    Positive(r, n, "rank", path, static_cast<double>(p.rank));
    AtMost(r, n, "rank", path, p.rank, int64_t{1024});
  }
  if (r.Int(n, "start_iteration", path, &p.start_iteration)) {
    NonNegative(r, n, "start_iteration", path, static_cast<double>(p.start_iteration));
  }
  if (r.Double(n, "min_compression_rate", path, &p.min_compression_rate)) {
    Positive(r, n, "min_compression_rate", path, p.min_compression_rate);
  }
  r.Bool(n, "error_feedback", path, &p.error_feedback);
  r.Bool(n, "warm_start", path, &p.warm_start);
  if (r.Double(n, "orthogonalization_epsilon", path, &p.orthogonalization_epsilon)) {
    NonNegative(r, n, "orthogonalization_epsilon", path, p.orthogonalization_epsilon);
  }
  if (r.Int(n, "random_seed", path, &p.random_seed)) {
    NonNegative(r, n, "random_seed", path, static_cast<double>(p.random_seed));
    AtMost(r, n, "random_seed", path, p.random_seed, int64_t{4294967295});
  }
  r.Bool(n, "batch_tensors_with_same_shape", path, &p.batch_tensors_with_same_shape);
  // PyTorch's ValueError in PowerSGDState.
  if ((p.error_feedback || p.warm_start) && p.start_iteration <= 1) {
    r.Error(n["start_iteration"] ? n["start_iteration"] : n, path + ".start_iteration",
            "must be > 1 while error_feedback or warm_start is on (PowerSGD can only start "
            "after the first two iterations): set it to 2 or more, or turn both off");
  }
}

void ParseTrain(Reader& r, const YAML::Node& root, JobSpec* spec) {
  const YAML::Node n = r.Sub(root, "train");
  if (!n) {
    r.Error(root, "train", "is required (at least train.batch_size)");
    return;
  }
  if (!r.Map(n, "train",
             {"epochs", "batch_size", "drop_last", "shuffle", "optimizer", "loss",
              "bucket_cap_mb", "first_bucket_cap_mb", "grad_accum_steps", "seed", "collective_timeout_s",
              "stall_timeout_s", "threads",
              "max_steps", "precision", "intra_node_comm", "device", "clip_grad_norm", "lr_schedule",
              "comm_hook", "powersgd", "cuda_graph"})) {
    return;
  }
  TrainSpec& t = spec->train;
  if (r.Int(n, "epochs", "train", &t.epochs)) {
    Positive(r, n, "epochs", "train", t.epochs);
    AtMost(r, n, "epochs", "train", t.epochs, kMaxEpochs);
  }
  if (r.Int(n, "batch_size", "train", &t.batch_size, /*required=*/true)) {
    Positive(r, n, "batch_size", "train", t.batch_size);
    AtMost(r, n, "batch_size", "train", t.batch_size, kMaxBatchSize);
  }
  r.Bool(n, "drop_last", "train", &t.drop_last);
  r.Bool(n, "shuffle", "train", &t.shuffle);
  ParseOptimizer(r, n, &t);
  ParseLrSchedule(r, n, &t);
  ParseCommHook(r, n, &t);
  if (r.Double(n, "clip_grad_norm", "train", &t.clip_grad_norm)) {
    NonNegative(r, n, "clip_grad_norm", "train", t.clip_grad_norm);
    AtMost(r, n, "clip_grad_norm", "train", t.clip_grad_norm, kMaxOptimizerValue);
  }
  std::string loss;
  if (r.String(n, "loss", "train", &loss)) {
    if (loss == "cross_entropy") {
      t.loss = LossKind::kCrossEntropy;
    } else if (loss == "mse") {
      t.loss = LossKind::kMse;
    } else if (loss == "bce_with_logits") {
      t.loss = LossKind::kBceWithLogits;
    } else {
      r.Error(n["loss"], "train.loss",
              absl::StrCat("must be cross_entropy, mse or bce_with_logits (got '", loss, "')"));
    }
  }
  if (r.Double(n, "bucket_cap_mb", "train", &t.bucket_cap_mb)) {
    Positive(r, n, "bucket_cap_mb", "train", t.bucket_cap_mb);
    AtMost(r, n, "bucket_cap_mb", "train", t.bucket_cap_mb, kMaxBucketCapMb);
  }
  if (r.Double(n, "first_bucket_cap_mb", "train", &t.first_bucket_cap_mb)) {
    Positive(r, n, "first_bucket_cap_mb", "train", t.first_bucket_cap_mb);
    AtMost(r, n, "first_bucket_cap_mb", "train", t.first_bucket_cap_mb, kMaxBucketCapMb);
  }
  if (r.Int(n, "grad_accum_steps", "train", &t.grad_accum_steps)) {
    Positive(r, n, "grad_accum_steps", "train", t.grad_accum_steps);
    AtMost(r, n, "grad_accum_steps", "train", t.grad_accum_steps, kMaxGradAccumSteps);
  }
  Seed(r, n, "train", &t.seed);
  if (r.Double(n, "collective_timeout_s", "train", &t.collective_timeout_s)) {
    Positive(r, n, "collective_timeout_s", "train", t.collective_timeout_s);
    AtMost(r, n, "collective_timeout_s", "train", t.collective_timeout_s,
           kMaxCollectiveTimeoutS);
  }
  if (r.Double(n, "stall_timeout_s", "train", &t.stall_timeout_s)) {
    NonNegative(r, n, "stall_timeout_s", "train", t.stall_timeout_s);
    AtMost(r, n, "stall_timeout_s", "train", t.stall_timeout_s, kMaxCollectiveTimeoutS);
  }
  if (r.Int(n, "threads", "train", &t.threads)) {
    NonNegative(r, n, "threads", "train", t.threads);
    AtMost(r, n, "threads", "train", t.threads, kMaxThreads);
  }
  if (r.Int(n, "max_steps", "train", &t.max_steps)) {
    NonNegative(r, n, "max_steps", "train", t.max_steps);
    AtMost(r, n, "max_steps", "train", t.max_steps, kMaxSteps);
  }
  std::string precision;
  if (r.String(n, "precision", "train", &precision)) {
    if (precision == "fp32") {
      t.precision = Precision::kFp32;
    } else if (precision == "bf16") {
      t.precision = Precision::kBf16;
    } else {
      r.Error(n["precision"], "train.precision",
              absl::StrCat("must be fp32 or bf16 (got '", precision, "')"));
    }
  }
  std::string intra;
  if (r.String(n, "intra_node_comm", "train", &intra)) {
    if (intra == "auto") {
      t.intra_node_comm = IntraNodeComm::kAuto;
    } else if (intra == "shm") {
      t.intra_node_comm = IntraNodeComm::kShm;
    } else if (intra == "gloo") {
      t.intra_node_comm = IntraNodeComm::kGloo;
    } else {
      r.Error(n["intra_node_comm"], "train.intra_node_comm",
              absl::StrCat("must be auto, shm or gloo (got '", intra, "')"));
    }
  }
  // train.cuda_graph: auto, or a boolean (true: required, false: never).
  int graph = 2;
  if (r.BoolOrWord(n, "cuda_graph", "train", "auto", &graph)) {
    t.cuda_graph = graph == 2   ? CudaGraphMode::kAuto
                   : graph == 1 ? CudaGraphMode::kOn
                                : CudaGraphMode::kOff;
  }
  std::string device;
  if (r.String(n, "device", "train", &device)) {
    if (device == "auto") {
      t.device = Device::kAuto;
    } else if (device == "cpu") {
      t.device = Device::kCpu;
    } else if (device == "cuda") {
      t.device = Device::kCuda;
    } else {
      r.Error(n["device"], "train.device",
              absl::StrCat("must be auto, cpu or cuda (got '", device, "')"));
    }
  }
}

void ParseRest(Reader& r, const YAML::Node& root, JobSpec* spec) {
  if (const YAML::Node n = r.Sub(root, "rdzv")) {
    if (r.Map(n, "rdzv", {"last_call_s", "timeout_s"})) {
      if (r.Double(n, "last_call_s", "rdzv", &spec->rdzv.last_call_s)) {
        NonNegative(r, n, "last_call_s", "rdzv", spec->rdzv.last_call_s);
        AtMost(r, n, "last_call_s", "rdzv", spec->rdzv.last_call_s, kMaxLastCallS);
      }
      if (r.Double(n, "timeout_s", "rdzv", &spec->rdzv.timeout_s)) {
        Positive(r, n, "timeout_s", "rdzv", spec->rdzv.timeout_s);
        AtMost(r, n, "timeout_s", "rdzv", spec->rdzv.timeout_s, kMaxRdzvTimeoutS);
      }
    }
  }
  if (const YAML::Node n = r.Sub(root, "checkpoint")) {
    if (r.Map(n, "checkpoint", {"dir", "every_epochs", "every_steps", "keep", "resume", "async"})) {
      CheckpointSpec& c = spec->checkpoint;
      r.String(n, "dir", "checkpoint", &c.dir, /*required=*/true);
      // Neither given: every epoch. Both given as 0: only the final checkpoint.
      if (!n["every_epochs"] && !n["every_steps"]) c.every_epochs = 1;
      if (r.Int(n, "every_epochs", "checkpoint", &c.every_epochs)) {
        NonNegative(r, n, "every_epochs", "checkpoint", c.every_epochs);
        AtMost(r, n, "every_epochs", "checkpoint", c.every_epochs, kMaxEpochs);
      }
      if (r.Int(n, "every_steps", "checkpoint", &c.every_steps)) {
        NonNegative(r, n, "every_steps", "checkpoint", c.every_steps);
        AtMost(r, n, "every_steps", "checkpoint", c.every_steps, kMaxSteps);
      }
      if (r.Int(n, "keep", "checkpoint", &c.keep)) Positive(r, n, "keep", "checkpoint", c.keep);
      {
        int resume = 1;
        if (r.BoolOrWord(n, "resume", "checkpoint", "force", &resume)) {
          c.resume = resume == 2 ? ResumePolicy::kForce
                                 : (resume == 1 ? ResumePolicy::kYes : ResumePolicy::kNo);
        }
      }
      r.Bool(n, "async", "checkpoint", &c.async);
    }
  }
  if (const YAML::Node n = r.Sub(root, "metrics")) {
    if (r.Map(n, "metrics", {"every_steps", "trace_buckets"})) {
      if (r.Int(n, "every_steps", "metrics", &spec->metrics.every_steps)) {
        Positive(r, n, "every_steps", "metrics", spec->metrics.every_steps);
        AtMost(r, n, "every_steps", "metrics", spec->metrics.every_steps, kMaxSteps);
      }
      r.Bool(n, "trace_buckets", "metrics", &spec->metrics.trace_buckets);
    }
  }
}

// Rules that tie fields together, checked once the fields themselves parsed.
void CrossCheck(Reader& r, const YAML::Node& root, JobSpec* spec) {
  if (spec->model.kind == ModelSpec::Kind::kCnn && root["model"] &&
      spec->data.kind != DataSpec::Kind::kIdx && root["data"]) {
    r.Error(root["model"]["cnn"], "model.cnn", "needs image data (data.idx)");
  }
  // A GPT learns the next token of a token stream; a token stream is nothing else's input.
  const bool gpt = spec->model.kind == ModelSpec::Kind::kGpt;
  const bool tokens = spec->data.kind == DataSpec::Kind::kTokens;
  if (gpt && !tokens && root["data"]) {
    r.Error(root["model"]["gpt"], "model.gpt",
            "needs token data (data.tokens: {path: train.bin}): it learns the next token of "
            "a token stream");
  }
  if (tokens && !gpt && root["model"]) {
    r.Error(root["data"]["tokens"], "data.tokens",
            "is a token stream for model.gpt (windows of seq_len + 1 tokens); other models "
            "train on csv, idx or synthetic data");
  }
  if (gpt && spec->train.loss != LossKind::kCrossEntropy) {
    r.Error(root["train"]["loss"], "train.loss",
            absl::StrCat("model.gpt trains with cross_entropy over the next token (got ",
                         LossName(spec->train.loss), ")"));
  }
  if (spec->train.collective_timeout_s <= spec->rdzv.timeout_s && root["train"]) {
    r.Error(root["train"]["collective_timeout_s"] ? root["train"]["collective_timeout_s"]
                                                   : root["train"],
            "train.collective_timeout_s",
            absl::StrCat("must be greater than rdzv.timeout_s (", spec->rdzv.timeout_s,
                         "s): timeouts are ordered rendezvous < collective"));
  }
  if (spec->train.stall_timeout_s > 0 &&
      spec->train.stall_timeout_s >= spec->train.collective_timeout_s && root["train"]) {
    r.Error(root["train"]["stall_timeout_s"], "train.stall_timeout_s",
            absl::StrCat("must be less than train.collective_timeout_s (",
                         spec->train.collective_timeout_s,
                         "s): the watchdog names the stalled rank before the trainers' "
                         "collective timeout blames a peer"));
  }
  if (spec->train.device == Device::kCpu && spec->backend == Backend::kNccl) {
    r.Error(root["train"]["device"], "train.device",
            "cpu, but backend: nccl reduces GPU tensors only: use backend gloo (or auto), or "
            "device cuda");
  }
  if (spec->train.device == Device::kCuda && spec->train.intra_node_comm == IntraNodeComm::kShm) {
    r.Error(root["train"]["intra_node_comm"], "train.intra_node_comm",
            "shm reduces CPU tensors, but train.device is cuda: use auto or gloo");
  }
  if (spec->train.intra_node_comm == IntraNodeComm::kShm && spec->backend == Backend::kNccl &&
      root["train"]) {
    r.Error(root["train"]["intra_node_comm"], "train.intra_node_comm",
            "shm reduces CPU tensors, but backend: nccl trains on GPUs (NCCL already uses "
            "shared memory or NVLink within a node): use auto or gloo");
  }
  // train.cuda_graph: true asks for what the job as written rules out (decision 173);
  // what depends on the node (a GPU there, the LibTorch) the trainer checks.
  if (spec->train.cuda_graph == CudaGraphMode::kOn && root["train"]) {
    const YAML::Node at = root["train"]["cuda_graph"];
    const char* const kWhy = "train.cuda_graph";
    if (spec->train.device == Device::kCpu) {
      r.Error(at, kWhy, "true, but train.device is cpu: a CUDA graph captures GPU work");
    }
    if (spec->backend == Backend::kGloo) {
      r.Error(at, kWhy,
              "true, but backend: gloo runs its collectives on the host, which a graph "
              "cannot hold: use nccl (or auto)");
    }
    if (spec->train.comm_hook != CommHookKind::kNone) {
      r.Error(at, kWhy,
              "true, but train.comm_hook: a hook's collectives wait on the host between "
              "buckets: drop the hook, or set cuda_graph: auto");
    }
    if (spec->train.optimizer.zero_redundancy) {
      r.Error(at, kWhy,
              "true, but train.optimizer.zero_redundancy: ZeRO's broadcasts wait on the "
              "host: drop zero_redundancy, or set cuda_graph: auto");
    }
    if (spec->metrics.trace_buckets) {
      r.Error(at, kWhy,
              "true, but metrics.trace_buckets: the reducer's timeline is taken by host "
              "hooks, which a replayed graph does not run: set trace_buckets: false");
    }
    if (spec->train.optimizer.fused == FusedPolicy::kFalse) {
      r.Error(at, kWhy,
              "true, but train.optimizer.fused: false: the unfused optimizers keep their step "
              "counts and learning rate on the host, which a graph would freeze: set fused: "
              "auto or true");
    }
  }
  // ZeRO: the state of a rank's shard lives on that rank only, so a rank that fails
  // takes it along; a live recovery (which keeps the survivors' state) cannot rebuild
  // it. A restart from the newest checkpoint can (decision 163).
  if (spec->train.optimizer.zero_redundancy && spec->max_recoveries > 0 && root["train"]) {
    r.Error(root["train"]["optimizer"]["zero_redundancy"], "train.optimizer.zero_redundancy",
            absl::StrCat("cannot be recovered live (max_recoveries: ", spec->max_recoveries,
                         "): the optimizer state of each rank's shard is on that rank only "
                         "and is lost with it. Set max_recoveries: 0 (a failed attempt then "
                         "restarts from the newest checkpoint, up to max_restarts), or drop "
                         "zero_redundancy"));
  }
}

}  // namespace

absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text, const std::string& source) {
  if (absl::Status st = CheckJobText(yaml_text, source, kMaxSpecBytes); !st.ok()) return st;
  YAML::Node root;
  try {
    if (const int second = SecondDocumentLine(yaml_text); second > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ":", second,
          ": a second YAML document begins here; a job file holds one job (one document): "
          "put each job in a file of its own and submit each"));
    }
    root = YAML::Load(yaml_text);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.mark.line + 1, ": not valid YAML: ", e.msg));
  }
  Reader r(source);
  JobSpec spec;
  if (!root || root.IsNull()) {
    return absl::InvalidArgumentError(absl::StrCat(source, ":1: the job file is empty"));
  }
  try {
    if (r.Map(root, "",
              {"name", "rdzv_id", "nodes", "nproc_per_node", "backend", "max_restarts",
               "max_recoveries", "recovery_timeout_s", "stop_grace_s", "notice_signal",
               "workdir", "env", "command", "stall_timeout_s", "model", "data", "train", "rdzv",
               "checkpoint", "metrics", "priority", "node_selector", "preemption",
               "preemption_notice_s", "tracking"})) {
      ParseTop(r, root, &spec);
      ParseTracking(r, root, &spec);
      if (CheckKind(r, root)) {
        if (root["command"]) {
          ParseCommand(r, root, &spec);
          ParseRest(r, root, &spec);  // rdzv
        } else {
          ParseModel(r, root, &spec);
          ParseData(r, root, &spec);
          ParseTrain(r, root, &spec);
          ParseRest(r, root, &spec);
          if (r.errors().empty()) CrossCheck(r, root, &spec);
        }
      }
    }
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.mark.line + 1, ": ", e.msg));
  }
  if (!r.errors().empty()) return absl::InvalidArgumentError(absl::StrJoin(r.errors(), "\n"));
  return spec;
}

absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read job file ", path));
  // Read one byte past the limit at most: a huge file is refused without reading it.
  std::string text(kMaxSpecBytes + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (text.size() > kMaxSpecBytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        path, " is larger than ", kMaxSpecBytes,
        " bytes, the most a job file may have (the spec size limit)"));
  }
  return ParseJobSpec(text, path);
}

const char* BackendName(Backend b) {
  switch (b) {
    case Backend::kAuto: return "auto";
    case Backend::kNccl: return "nccl";
    case Backend::kGloo: return "gloo";
  }
  return "?";
}

const char* IntraNodeCommName(IntraNodeComm c) {
  switch (c) {
    case IntraNodeComm::kAuto: return "auto";
    case IntraNodeComm::kShm: return "shm";
    case IntraNodeComm::kGloo: return "gloo";
  }
  return "?";
}

const char* DeviceName(Device d) {
  switch (d) {
    case Device::kAuto: return "auto";
    case Device::kCpu: return "cpu";
    case Device::kCuda: return "cuda";
  }
  return "?";
}

const char* CudaGraphModeName(CudaGraphMode m) {
  switch (m) {
    case CudaGraphMode::kAuto: return "auto";
    case CudaGraphMode::kOn: return "true";
    case CudaGraphMode::kOff: return "false";
  }
  return "?";
}

const char* LrScheduleName(LrSchedule::Kind k) {
  switch (k) {
    case LrSchedule::Kind::kConstant: return "constant";
    case LrSchedule::Kind::kStep: return "step";
    case LrSchedule::Kind::kCosine: return "cosine";
    case LrSchedule::Kind::kLinear: return "linear";
  }
  return "?";
}

const char* TokenDtypeName(TokenDtype d) {
  switch (d) {
    case TokenDtype::kUint16: return "uint16";
    case TokenDtype::kUint32: return "uint32";
  }
  return "?";
}

int64_t GptParameterCount(const GptSpec& g) {
  const int64_t c = g.dim;
  // Per block: ln_1, c_attn, attn.c_proj, ln_2, c_fc, mlp.c_proj, weights and biases.
  const int64_t block = 2 * c + (3 * c * c + 3 * c) + (c * c + c) + 2 * c + (4 * c * c + 4 * c) +
                        (4 * c * c + c);
  return g.vocab * c + g.seq_len * c + g.layers * block + 2 * c +
         (g.tie_weights ? 0 : g.vocab * c);
}

const char* LossName(LossKind l) {
  switch (l) {
    case LossKind::kCrossEntropy: return "cross_entropy";
    case LossKind::kMse: return "mse";
    case LossKind::kBceWithLogits: return "bce_with_logits";
  }
  return "?";
}

const char* OptimizerName(OptimizerKind o) {
  switch (o) {
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kAdamW: return "adamw";
  }
  return "?";
}

std::string NodeRangeString(const NodeRange& r) {
  return r.elastic() ? absl::StrCat(r.min, ":", r.max) : absl::StrCat(r.min);
}

}  // namespace ddp
