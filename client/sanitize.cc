#include "client/sanitize.h"

#include <cstdint>

#include "common/utf8.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/reflection.h"

namespace ddp {
namespace {

bool IsBidiControl(uint32_t cp) {
  return (cp >= 0x202A && cp <= 0x202E) || (cp >= 0x2066 && cp <= 0x2069) || cp == 0x200E ||
         cp == 0x200F || cp == 0x061C;
}

// Skips the rest of an escape sequence whose introducer ended just before s[i]:
// `kind` is the byte after ESC ('[' CSI, ']' OSC, 'P' DCS, ...) or the C1 code point.
size_t SkipSequence(absl::string_view s, size_t i, uint32_t kind) {
  if (kind == '[' || kind == 0x9B) {  // CSI: parameters and intermediates, then a final byte.
    while (i < s.size()) {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      if (c >= 0x20 && c <= 0x3F) {  // Parameter and intermediate bytes.
        ++i;
        continue;
      }
      if (c >= 0x40 && c <= 0x7E) ++i;  // The final byte.
      break;
    }
    return i;
  }
  const bool string_kind = kind == ']' || kind == 'P' || kind == 'X' || kind == '^' ||
                           kind == '_' || kind == 0x9D || kind == 0x90 || kind == 0x98 ||
                           kind == 0x9E || kind == 0x9F;
  if (string_kind) {  // Runs to BEL or ST (ESC \ or U+009C).
    while (i < s.size()) {
      const unsigned char c = static_cast<unsigned char>(s[i]);
      if (c == 0x07) return i + 1;
      if (c == 0x1B && i + 1 < s.size() && s[i + 1] == '\\') return i + 2;
      if (c == 0xC2 && i + 1 < s.size() && static_cast<unsigned char>(s[i + 1]) == 0x9C) {
        return i + 2;
      }
      ++i;
    }
    return i;
  }
  return i;  // Two-byte escapes (ESC c, ESC 7, ...): the introducer was all of it.
}

}  // namespace

std::string SanitizeText(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    uint32_t cp = 0;
    const size_t n = Utf8CharLength(std::string_view(s.data(), s.size()), i, &cp);
    if (n == 0) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      ++i;
      continue;
    }
    if (cp == 0x1B) {  // ESC: drop it and the sequence it introduces.
      i += 1;
      if (i < s.size()) {
        const unsigned char kind = static_cast<unsigned char>(s[i]);
        i = (kind >= 0x20 && kind <= 0x7E) ? SkipSequence(s, i + 1, kind) : i;
      }
      continue;
    }
    if (cp >= 0x80 && cp <= 0x9F) {  // C1 controls, CSI/OSC/DCS among them.
      i = SkipSequence(s, i + n, cp);
      continue;
    }
    if ((cp < 0x20 && cp != '\t' && cp != '\n') || cp == 0x7F || IsBidiControl(cp)) {
      i += n;
      continue;
    }
    out.append(s.data() + i, n);
    i += n;
  }
  return out;
}

void SanitizeMessage(google::protobuf::Message* m) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Descriptor* d = m->GetDescriptor();
  const google::protobuf::Reflection* r = m->GetReflection();
  for (int f = 0; f < d->field_count(); ++f) {
    const FieldDescriptor* field = d->field(f);
    if (field->cpp_type() == FieldDescriptor::CPPTYPE_STRING &&
        field->type() != FieldDescriptor::TYPE_BYTES) {
      if (field->is_repeated()) {
        for (int k = 0; k < r->FieldSize(*m, field); ++k) {
          r->SetRepeatedString(m, field, k, SanitizeText(r->GetRepeatedString(*m, field, k)));
        }
      } else if (r->HasField(*m, field) || !field->has_presence()) {
        const std::string v = r->GetString(*m, field);
        if (!v.empty()) r->SetString(m, field, SanitizeText(v));
      }
    } else if (field->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE) {
      if (field->is_repeated()) {
        for (int k = 0; k < r->FieldSize(*m, field); ++k) {
          SanitizeMessage(r->MutableRepeatedMessage(m, field, k));
        }
      } else if (r->HasField(*m, field)) {
        SanitizeMessage(r->MutableMessage(m, field));
      }
    }
  }
}

}  // namespace ddp
