// Training data in memory: CSV tables, IDX image sets (MNIST / Fashion-MNIST, gzip
// allowed) and synthetic classification data, split and standardized exactly as
// docs/trainer.md says (Data split), token streams (data.tokens, trainer/token_data.h),
// plus a batch assembler that gathers a batch into preallocated tensors (no per-sample
// allocation in the training loop).
#ifndef DDP_TRAINER_DATASET_H_
#define DDP_TRAINER_DATASET_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/jobspec/job_spec.h"
#include "trainer/token_data.h"

namespace ddp {

struct Dataset {
  at::Tensor features;  // float32 [N, ...sample shape]
  at::Tensor targets;   // int64 [N] for cross_entropy, float32 [N] otherwise
  // data.tokens instead: the samples are the stream's windows (features and targets
  // stay undefined; BatchAssembler gathers [n, seq_len] int64 inputs and targets).
  std::shared_ptr<const TokenStream> tokens;
  int64_t size() const {
    if (tokens) return tokens->windows();
    return features.defined() ? features.size(0) : 0;
  }
};

struct TrainValData {
  Dataset train;
  Dataset val;              // Empty when there is no validation set.
  int64_t num_classes = 0;  // cross_entropy: max label + 1; otherwise 0.
  // Shape of one sample, e.g. {30} or {1, 28, 28}.
  // Token data: {seq_len}, the window's length.
  std::vector<int64_t> sample_shape;
};

// Loads `spec`'s data and splits it:
//   validation.fraction f of N rows: torch::manual_seed(data.seed); p = randperm(N);
//   the last round(f*N) rows of p (round half to even, as Python) are validation,
//   the rest training, in p's order. csv.standardize z-scores every feature with
//   the training split's mean and population std.
// Targets are checked against `loss`: class ids >= 0 for cross_entropy, 0/1 for
// bce_with_logits. data.tokens: the training file and data.validation.tokens, their
// windows of `model.gpt.seq_len` and ids below `model.gpt.vocab` (TokenStream::Load).
// Errors: NOT_FOUND for missing files, INVALID_ARGUMENT naming the file and line (or
// token) for bad content (both permanent for the job).
absl::StatusOr<TrainValData> LoadData(const DataSpec& spec, LossKind loss,
                                      const ModelSpec& model = ModelSpec());

// Gathers rows of a Dataset (or windows of its token stream) into reused buffers sized
// for `max_batch` rows.
class BatchAssembler {
 public:
  BatchAssembler(const Dataset& data, int64_t max_batch);
  // Returns views of the internal buffers holding rows `indices[0..n)`; valid until
  // the next call. n <= max_batch.
  std::pair<at::Tensor, at::Tensor> Gather(const int64_t* indices, int64_t n);

 private:
  const Dataset& data_;
  at::Tensor index_;
  at::Tensor x_;
  at::Tensor y_;
};

}  // namespace ddp

#endif  // DDP_TRAINER_DATASET_H_
