// Token streams for model.gpt (data.tokens): a flat little-endian file of token ids,
// nanoGPT's prepare.py format (train.bin, val.bin), held once in memory.
//
// Sample i of a stream is the window [i * seq_len, (i + 1) * seq_len + 1): its input is
// the first seq_len tokens, its target the last seq_len (each input token's next). The
// windows do not overlap but for the one token a window's target shares with the next
// window's input, so a stream of N tokens has (N - 1) / seq_len of them, and the
// DistributedSampler shards window indices as it shards rows (docs/trainer.md, GPT).
// The windows are never materialized: a batch is gathered from the ids into reused
// int64 buffers (BatchAssembler).
#ifndef DDP_TRAINER_TOKEN_DATA_H_
#define DDP_TRAINER_TOKEN_DATA_H_

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "common/jobspec/job_spec.h"

namespace ddp {

class TokenStream {
 public:
  // Reads `spec.path` whole. `field` names it in errors ("data.tokens"). Errors, each
  // naming the field and the file: NOT_FOUND when it cannot be opened; INVALID_ARGUMENT
  // when its size is not a whole number of `spec.dtype` ids, when an id is >= `vocab`
  // (which one, and where), or when it holds fewer than seq_len + 1 tokens (one window).
  static absl::StatusOr<std::shared_ptr<const TokenStream>> Load(const TokensSpec& spec,
                                                                 const std::string& field,
                                                                 int64_t vocab, int64_t seq_len);

  int64_t num_tokens() const { return ids_.numel(); }
  int64_t seq_len() const { return seq_len_; }
  int64_t windows() const { return (num_tokens() - 1) / seq_len_; }
  // The ids as read: int16 holding uint16's bits, or int32 holding uint32's.
  const at::Tensor& ids() const { return ids_; }

  // Windows `indices[0..n)` as rows of `x` (inputs) and `y` (targets), each a
  // contiguous int64 [n, seq_len] buffer.
  void Gather(const int64_t* indices, int64_t n, int64_t* x, int64_t* y) const;

 private:
  TokenStream(at::Tensor ids, TokenDtype dtype, int64_t seq_len)
      : ids_(std::move(ids)), dtype_(dtype), seq_len_(seq_len) {}

  at::Tensor ids_;
  TokenDtype dtype_;
  int64_t seq_len_;
};

}  // namespace ddp

#endif  // DDP_TRAINER_TOKEN_DATA_H_
