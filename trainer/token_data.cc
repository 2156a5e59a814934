#include "trainer/token_data.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

template <typename Id>
void Swap(Id* ids, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    Id v = ids[i];
    Id out = 0;
    for (size_t b = 0; b < sizeof(Id); ++b) {
      out = static_cast<Id>((out << 8) | ((v >> (8 * b)) & 0xff));
    }
    ids[i] = out;
  }
}

// The first position whose id is >= vocab, or -1. A branch-free pass first (it
// vectorizes, and a good file is all it ever sees), then the search for the culprit.
template <typename Id>
int64_t FirstOutOfVocab(const Id* ids, int64_t n, int64_t vocab) {
  const uint64_t limit = static_cast<uint64_t>(vocab);
  Id most = 0;
  for (int64_t i = 0; i < n; ++i) most = std::max(most, ids[i]);
  if (static_cast<uint64_t>(most) < limit) return -1;
  for (int64_t i = 0; i < n; ++i) {
    if (static_cast<uint64_t>(ids[i]) >= limit) return i;
  }
  return -1;
}

template <typename Id>
void GatherWindows(const Id* ids, int64_t seq_len, const int64_t* indices, int64_t n, int64_t* x,
                   int64_t* y) {
  for (int64_t b = 0; b < n; ++b) {
    const Id* w = ids + indices[b] * seq_len;
    int64_t* xb = x + b * seq_len;
    int64_t* yb = y + b * seq_len;
    for (int64_t t = 0; t < seq_len; ++t) {
      xb[t] = static_cast<int64_t>(w[t]);
      yb[t] = static_cast<int64_t>(w[t + 1]);
    }
  }
}

}  // namespace

absl::StatusOr<std::shared_ptr<const TokenStream>> TokenStream::Load(const TokensSpec& spec,
                                                                     const std::string& field,
                                                                     int64_t vocab,
                                                                     int64_t seq_len) {
  const std::string what = absl::StrCat(field, ".path: '", spec.path, "'");
  std::ifstream in(spec.path, std::ios::binary | std::ios::ate);
  if (!in) {
    return absl::NotFoundError(absl::StrCat(what, ": cannot open it (", std::strerror(errno),
                                            "; relative paths resolve in the job's workdir)"));
  }
  const int64_t bytes = static_cast<int64_t>(in.tellg());
  const bool wide = spec.dtype == TokenDtype::kUint32;
  const int64_t width = wide ? 4 : 2;
  const char* dtype = TokenDtypeName(spec.dtype);
  if (bytes < 0) return absl::UnavailableError(absl::StrCat(what, ": cannot tell its size"));
  if (bytes % width != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has ", bytes, " bytes, not a whole number of ", dtype, " token ids (", width,
        " bytes each): is it cut short, or written with another dtype (", field, ".dtype)?"));
  }
  const int64_t n = bytes / width;
  if (n < seq_len + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " holds ", n, " tokens, fewer than one window of model.gpt.seq_len + 1 = ",
        seq_len + 1, " (a window's input and its next-token targets)"));
  }
  // The file's bits as they are: int16 and int32 hold uint16 and uint32 ids (LibTorch
  // 1.13 has no unsigned 16- or 32-bit dtype), read back unsigned.
  at::Tensor ids = at::empty({n}, wide ? at::kInt : at::kShort);
  in.seekg(0);
  in.read(static_cast<char*>(ids.data_ptr()), static_cast<std::streamsize>(bytes));
  if (in.gcount() != bytes) {
    return absl::UnavailableError(absl::StrCat(what, ": read ", in.gcount(), " of its ", bytes,
                                               " bytes (", std::strerror(errno), ")"));
  }
  int64_t bad = -1;
  uint64_t bad_id = 0;
  if (wide) {
    auto* p = static_cast<uint32_t*>(ids.data_ptr());
    if constexpr (__BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__) Swap(p, n);
    bad = FirstOutOfVocab(p, n, vocab);
    if (bad >= 0) bad_id = p[bad];
  } else {
    auto* p = static_cast<uint16_t*>(ids.data_ptr());
    if constexpr (__BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__) Swap(p, n);
    bad = FirstOutOfVocab(p, n, vocab);
    if (bad >= 0) bad_id = p[bad];
  }
  if (bad >= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": token ", bad, " (byte ", bad * width, ") is id ", bad_id,
        ", not below model.gpt.vocab ", vocab,
        ": was the file made with another tokenizer, or with another dtype than ", dtype,
        "?"));
  }
  return std::shared_ptr<const TokenStream>(new TokenStream(std::move(ids), spec.dtype, seq_len));
}

void TokenStream::Gather(const int64_t* indices, int64_t n, int64_t* x, int64_t* y) const {
  if (dtype_ == TokenDtype::kUint32) {
    GatherWindows(static_cast<const uint32_t*>(ids_.data_ptr()), seq_len_, indices, n, x, y);
  } else {
    GatherWindows(static_cast<const uint16_t*>(ids_.data_ptr()), seq_len_, indices, n, x, y);
  }
}

}  // namespace ddp
