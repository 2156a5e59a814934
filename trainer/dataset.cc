#include "trainer/dataset.h"

#include <zlib.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "trainer/data_files.h"

namespace ddp {
namespace {

absl::StatusOr<Dataset> LoadCsv(const CsvSpec& spec) {
  std::ifstream in(spec.path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("data.csv.path: cannot open '", spec.path,
                                            "' (relative paths resolve in the job's workdir)"));
  }
  auto table = ParseCsv(in, spec);
  if (!table.ok()) return table.status();
  std::vector<float>& features = table->features;
  std::vector<double>& labels = table->labels;
  const int64_t columns = table->columns;
  const int64_t n = static_cast<int64_t>(labels.size());
  Dataset d;
  d.features = at::from_blob(features.data(), {n, columns - 1}, at::kFloat).clone();
  d.targets = at::from_blob(labels.data(), {n}, at::kDouble).clone();
  return d;
}

// Reads a whole file through zlib, which passes plain files through unchanged.
absl::StatusOr<std::string> ReadMaybeGzip(const std::string& path, const char* field) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat(field, ": cannot open '", path, "'"));
  }
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  bool failed = n < 0;
  gzclose(f);
  if (failed) return absl::InvalidArgumentError(absl::StrCat(field, ": '", path, "' is corrupt"));
  return out;
}

absl::StatusOr<Dataset> LoadIdx(const IdxSpec& spec, const std::string& field) {
  auto images = ReadMaybeGzip(spec.images, (field + ".images").c_str());
  if (!images.ok()) return images.status();
  auto labels = ReadMaybeGzip(spec.labels, (field + ".labels").c_str());
  if (!labels.ok()) return labels.status();
  auto shape = ParseIdxHeaders(*images, *labels, spec, field);
  if (!shape.ok()) return shape.status();
  const int64_t n = shape->n, rows = shape->rows, cols = shape->cols;
  Dataset d;
  d.features = at::from_blob(images->data() + 16, {n, 1, rows, cols}, at::kByte)
                   .to(at::kFloat)
                   .div_(255.0);
  d.targets = at::from_blob(labels->data() + 8, {n}, at::kByte).to(at::kDouble);
  return d;
}

Dataset MakeSynthetic(const SyntheticSpec& spec, LossKind loss, int64_t seed) {
  at::manual_seed(static_cast<uint64_t>(seed));
  Dataset d;
  d.features = at::randn({spec.samples, spec.features});
  if (loss == LossKind::kCrossEntropy) {
    at::Tensor teacher = at::randn({spec.features, spec.classes});
    d.targets = d.features.matmul(teacher).argmax(1).to(at::kDouble);
  } else {
    at::Tensor teacher = at::randn({spec.features, 1}) / std::sqrt(double(spec.features));
    at::Tensor score = d.features.matmul(teacher).squeeze(1);
    d.targets = (loss == LossKind::kBceWithLogits ? score.gt(0) : score).to(at::kDouble);
  }
  return d;
}

// Converts raw double targets into the loss's dtype, checking their values.
absl::Status FinishTargets(Dataset* d, LossKind loss, int64_t* num_classes) {
  if (d->size() == 0) return absl::OkStatus();
  at::Tensor t = d->targets;
  if (loss == LossKind::kCrossEntropy) {
    if (!at::equal(t, t.round()) || t.min().item<double>() < 0) {
      return absl::InvalidArgumentError(
          "train.loss cross_entropy needs integer class ids >= 0 in the label column");
    }
    *num_classes = std::max<int64_t>(*num_classes, t.max().item<int64_t>() + 1);
    d->targets = t.to(at::kLong);
  } else {
    if (loss == LossKind::kBceWithLogits && !(t.eq(0) | t.eq(1)).all().item<bool>()) {
      return absl::InvalidArgumentError(
          "train.loss bce_with_logits needs labels that are 0 or 1");
    }
    d->targets = t.to(at::kFloat);
  }
  return absl::OkStatus();
}

void Standardize(TrainValData* data) {
  at::Tensor x = data->train.features;
  at::Tensor mean = x.mean(0, /*keepdim=*/true);
  at::Tensor std = x.std(0, /*unbiased=*/false, /*keepdim=*/true);
  std = at::where(std.eq(0), at::ones_like(std), std);  // Constant columns stay finite.
  data->train.features = (x - mean) / std;
  if (data->val.size() > 0) data->val.features = (data->val.features - mean) / std;
}

absl::StatusOr<TrainValData> LoadTokens(const DataSpec& spec, const GptSpec& gpt) {
  TrainValData out;
  DDP_ASSIGN_OR_RETURN(out.train.tokens,
                       TokenStream::Load(spec.tokens, "data.tokens", gpt.vocab, gpt.seq_len));
  if (spec.validation.has_tokens) {
    DDP_ASSIGN_OR_RETURN(out.val.tokens, TokenStream::Load(spec.validation.tokens,
                                                           "data.validation.tokens", gpt.vocab,
                                                           gpt.seq_len));
  }
  out.num_classes = gpt.vocab;
  out.sample_shape = {gpt.seq_len};
  return out;
}

}  // namespace

absl::StatusOr<TrainValData> LoadData(const DataSpec& spec, LossKind loss,
                                      const ModelSpec& model) {
  if (spec.kind == DataSpec::Kind::kTokens) return LoadTokens(spec, model.gpt);
  Dataset all;
  switch (spec.kind) {
    case DataSpec::Kind::kCsv: {
      auto d = LoadCsv(spec.csv);
      if (!d.ok()) return d.status();
      all = std::move(*d);
      break;
    }
    case DataSpec::Kind::kIdx: {
      auto d = LoadIdx(spec.idx, "data.idx");
      if (!d.ok()) return d.status();
      all = std::move(*d);
      break;
    }
    case DataSpec::Kind::kSynthetic:
      all = MakeSynthetic(spec.synthetic, loss, spec.seed);
      break;
    case DataSpec::Kind::kTokens:
      break;  // LoadTokens
  }

  TrainValData out;
  const int64_t n = all.size();
  if (spec.validation.has_idx) {
    out.train = std::move(all);
    auto v = LoadIdx(spec.validation.idx, "data.validation.idx");
    if (!v.ok()) return v.status();
    out.val = std::move(*v);
    if (out.val.features.sizes().slice(1) != out.train.features.sizes().slice(1)) {
      return absl::InvalidArgumentError(
          "data.validation.idx: images differ in shape from data.idx's");
    }
  } else if (spec.validation.fraction > 0) {
    const int64_t n_val = static_cast<int64_t>(std::nearbyint(spec.validation.fraction * n));
    at::manual_seed(static_cast<uint64_t>(spec.seed));
    at::Tensor perm = at::randperm(n, at::TensorOptions().dtype(at::kLong));
    at::Tensor train_idx = perm.narrow(0, 0, n - n_val);
    at::Tensor val_idx = perm.narrow(0, n - n_val, n_val);
    out.train.features = all.features.index_select(0, train_idx);
    out.train.targets = all.targets.index_select(0, train_idx);
    out.val.features = all.features.index_select(0, val_idx);
    out.val.targets = all.targets.index_select(0, val_idx);
  } else {
    out.train = std::move(all);
  }
  if (out.train.size() == 0) {
    return absl::InvalidArgumentError("data: the training split is empty");
  }
  if (spec.kind == DataSpec::Kind::kCsv && spec.csv.standardize) Standardize(&out);

  absl::Status st = FinishTargets(&out.train, loss, &out.num_classes);
  if (st.ok()) st = FinishTargets(&out.val, loss, &out.num_classes);
  if (!st.ok()) return st;
  if (loss == LossKind::kCrossEntropy && out.num_classes < 2) out.num_classes = 2;
  auto shape = out.train.features.sizes().slice(1);
  out.sample_shape.assign(shape.begin(), shape.end());
  return out;
}

BatchAssembler::BatchAssembler(const Dataset& data, int64_t max_batch) : data_(data) {
  if (data.tokens) {
    x_ = at::empty({max_batch, data.tokens->seq_len()}, at::kLong);
    y_ = at::empty({max_batch, data.tokens->seq_len()}, at::kLong);
    return;
  }
  index_ = at::empty({max_batch}, at::kLong);
  std::vector<int64_t> xs(data.features.sizes().begin(), data.features.sizes().end());
  xs[0] = max_batch;
  x_ = at::empty(xs, data.features.options());
  y_ = at::empty({max_batch}, data.targets.options());
}

std::pair<at::Tensor, at::Tensor> BatchAssembler::Gather(const int64_t* indices, int64_t n) {
  if (data_.tokens) {
    at::Tensor x = x_.narrow(0, 0, n);
    at::Tensor y = y_.narrow(0, 0, n);
    data_.tokens->Gather(indices, n, x.data_ptr<int64_t>(), y.data_ptr<int64_t>());
    return {x, y};
  }
  at::Tensor idx = index_.narrow(0, 0, n);
  std::memcpy(idx.data_ptr<int64_t>(), indices, sizeof(int64_t) * static_cast<size_t>(n));
  at::Tensor x = x_.narrow(0, 0, n);
  at::Tensor y = y_.narrow(0, 0, n);
  at::index_select_out(x, data_.features, 0, idx);
  at::index_select_out(y, data_.targets, 0, idx);
  return {x, y};
}

}  // namespace ddp
