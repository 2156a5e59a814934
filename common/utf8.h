// UTF-8 validation and repair. Every string field of a protobuf message must be valid
// UTF-8 or the receiver fails to parse the whole message, so text that comes from
// outside (a trainer's output, a path, an OS error) is repaired before it goes into
// one: each invalid byte sequence becomes U+FFFD, as Python's errors="replace" does.
#ifndef DDP_COMMON_UTF8_H_
#define DDP_COMMON_UTF8_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ddp {

// Length (1 to 4) of the valid UTF-8 character that starts at s[i] (i < s.size()), or
// 0 if none does (a stray continuation byte, an overlong form, a surrogate, above
// U+10FFFF, or cut short); with `code_point`, its value.
size_t Utf8CharLength(std::string_view s, size_t i, uint32_t* code_point = nullptr);

// Length of the longest prefix of `s` that is valid UTF-8 (no overlong forms, no
// surrogates, nothing above U+10FFFF). Equals s.size() when all of it is.
size_t ValidUtf8Prefix(std::string_view s);
inline bool IsValidUtf8(std::string_view s) { return ValidUtf8Prefix(s) == s.size(); }

// `s` with every maximal invalid subsequence replaced by U+FFFD (the W3C/WHATWG
// "maximal subpart" rule). Valid input comes back unchanged.
std::string ToValidUtf8(std::string_view s);
// In place; returns whether anything was replaced. Cheap when `s` is valid.
bool MakeValidUtf8(std::string* s);

// The longest prefix of `s` no longer than `max_bytes` that does not end inside a
// multi-byte character (it may still contain invalid bytes earlier on).
size_t Utf8SafeCut(std::string_view s, size_t max_bytes);

}  // namespace ddp

#endif  // DDP_COMMON_UTF8_H_
