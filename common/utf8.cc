#include "common/utf8.h"

namespace ddp {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 character at s[i], or 0 if none starts there. When it
// returns 0, *consumed is the length of the maximal invalid subpart (>= 1) to replace.
size_t CharLength(std::string_view s, size_t i, size_t* consumed) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  *consumed = 1;
  if (c < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // Range of the first continuation byte.
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;   // No overlong forms.
    if (c == 0xED) hi = 0x9F;   // No surrogates.
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;   // No overlong forms.
    if (c == 0xF4) hi = 0x8F;   // Nothing above U+10FFFF.
  } else {
    return 0;  // A stray continuation byte, C0, C1 or F5..FF.
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      *consumed = k;  // Truncated at the end: the subpart so far.
      return 0;
    }
    const unsigned char b = byte(i + k);
    const unsigned char min = k == 1 ? lo : 0x80, max = k == 1 ? hi : 0xBF;
    if (b < min || b > max) {
      *consumed = k;
      return 0;
    }
  }
  return need + 1;
}

}  // namespace

size_t Utf8CharLength(std::string_view s, size_t i, uint32_t* code_point) {
  size_t consumed = 0;
  const size_t n = CharLength(s, i, &consumed);
  if (n == 0 || code_point == nullptr) return n;
  static constexpr unsigned char kLeadMask[] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  uint32_t cp = static_cast<unsigned char>(s[i]) & kLeadMask[n];
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *code_point = cp;
  return n;
}

size_t ValidUtf8Prefix(std::string_view s) {
  size_t i = 0, consumed = 0;
  while (i < s.size()) {
    // ASCII runs are the common case.
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    const size_t n = CharLength(s, i, &consumed);
    if (n == 0) return i;
    i += n;
  }
  return i;
}

std::string ToValidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const size_t valid = ValidUtf8Prefix(s.substr(i));
    out.append(s.data() + i, valid);
    i += valid;
    if (i >= s.size()) break;
    size_t consumed = 1;
    CharLength(s, i, &consumed);
    out += kReplacement;
    i += consumed;
  }
  return out;
}

bool MakeValidUtf8(std::string* s) {
  if (IsValidUtf8(*s)) return false;
  *s = ToValidUtf8(*s);
  return true;
}

size_t Utf8SafeCut(std::string_view s, size_t max_bytes) {
  if (s.size() <= max_bytes) return s.size();
  size_t cut = max_bytes;
  // Back off over continuation bytes (at most three) to the start of a character;
  // if that character fits entirely before max_bytes we would not be here.
  for (int k = 0; k < 3 && cut > 0 &&
                  (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80;
       ++k) {
    --cut;
  }
  return cut;
}

}  // namespace ddp
