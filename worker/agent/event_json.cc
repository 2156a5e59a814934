#include "worker/agent/event_json.h"

#include <cmath>
#include <cstdlib>
#include <cstdint>
#include <string>

#include "absl/strings/charconv.h"
#include "absl/strings/str_cat.h"

namespace ddp {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

// Recursive descent over the text; each byte is looked at a bounded number of times
// and the recursion is at most `max_depth` deep.
class JsonReader {
 public:
  JsonReader(std::string_view text, int max_depth) : text_(text), max_depth_(max_depth) {}

  absl::Status Document(Struct* out) {
    SkipSpace();
    if (!Peek('{')) {
      Fail("expected a JSON object");
      return error_;
    }
    if (!ReadObject(out, 1)) return error_;
    SkipSpace();
    if (pos_ != text_.size()) {
      Fail("unexpected text after the object");
      return error_;
    }
    return absl::OkStatus();
  }

 private:
  bool ReadValue(Value* out, int depth) {
    SkipSpace();
    if (pos_ >= text_.size()) return Fail("unexpected end of text");
    switch (text_[pos_]) {
      case '{':
        return ReadObject(out->mutable_struct_value(), depth + 1);
      case '[':
        return ReadArray(out->mutable_list_value(), depth + 1);
      case '"':
        return ReadString(out->mutable_string_value());
      case 't':
        if (!Literal("true")) return false;
        out->set_bool_value(true);
        return true;
      case 'f':
        if (!Literal("false")) return false;
        out->set_bool_value(false);
        return true;
      case 'n':
        if (!Literal("null")) return false;
        out->set_null_value(google::protobuf::NULL_VALUE);
        return true;
      default:
        return ReadNumber(out);
    }
  }

  // At '{'.
  bool ReadObject(Struct* out, int depth) {
    if (depth > max_depth_) return Fail(absl::StrCat("nested deeper than ", max_depth_, " levels"));
    ++pos_;
    SkipSpace();
    if (Peek('}')) {
      ++pos_;
      return true;
    }
    while (true) {
      SkipSpace();
      if (!Peek('"')) return Fail("expected a quoted key");
      std::string key;
      if (!ReadString(&key)) return false;
      SkipSpace();
      if (!Peek(':')) return Fail("expected ':'");
      ++pos_;
      Value value;
      if (!ReadValue(&value, depth)) return false;
      (*out->mutable_fields())[key] = std::move(value);
      SkipSpace();
      if (Peek(',')) {
        ++pos_;
        continue;
      }
      if (Peek('}')) {
        ++pos_;
        return true;
      }
      return Fail("expected ',' or '}'");
    }
  }

  // At '['.
  bool ReadArray(ListValue* out, int depth) {
    if (depth > max_depth_) return Fail(absl::StrCat("nested deeper than ", max_depth_, " levels"));
    ++pos_;
    SkipSpace();
    if (Peek(']')) {
      ++pos_;
      return true;
    }
    while (true) {
      if (!ReadValue(out->add_values(), depth)) return false;
      SkipSpace();
      if (Peek(',')) {
        ++pos_;
        continue;
      }
      if (Peek(']')) {
        ++pos_;
        return true;
      }
      return Fail("expected ',' or ']'");
    }
  }

  // At '"'. Appends the decoded string to `out`.
  bool ReadString(std::string* out) {
    ++pos_;
    while (true) {
      if (pos_ >= text_.size()) return Fail("unterminated string");
      const unsigned char c = static_cast<unsigned char>(text_[pos_]);
      if (c == '"') {
        ++pos_;
        return true;
      }
      if (c < 0x20) return Fail("a control character in a string (escape it)");
      if (c != '\\') {
        // Copy the run of plain bytes at once.
        size_t end = pos_ + 1;
        while (end < text_.size() && text_[end] != '"' && text_[end] != '\\' &&
               static_cast<unsigned char>(text_[end]) >= 0x20) {
          ++end;
        }
        out->append(text_.substr(pos_, end - pos_));
        pos_ = end;
        continue;
      }
      if (++pos_ >= text_.size()) return Fail("unterminated string");
      const char e = text_[pos_++];
      switch (e) {
        case '"': out->push_back('"'); break;
        case '\\': out->push_back('\\'); break;
        case '/': out->push_back('/'); break;
        case 'b': out->push_back('\b'); break;
        case 'f': out->push_back('\f'); break;
        case 'n': out->push_back('\n'); break;
        case 'r': out->push_back('\r'); break;
        case 't': out->push_back('\t'); break;
        case 'u': {
          uint32_t cp;
          if (!Hex4(&cp)) return false;
          if (cp >= 0xD800 && cp <= 0xDBFF && text_.substr(pos_, 2) == "\\u") {
            const size_t save = pos_;
            pos_ += 2;
            uint32_t low;
            if (!Hex4(&low)) return false;
            if (low >= 0xDC00 && low <= 0xDFFF) {
              cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
            } else {
              pos_ = save;  // Not a pair: the high one is alone; read the next on its own.
              cp = 0xFFFD;
            }
          } else if (cp >= 0xD800 && cp <= 0xDFFF) {
            cp = 0xFFFD;  // A lone surrogate has no UTF-8 form.
          }
          AppendUtf8(cp, out);
          break;
        }
        default:
          --pos_;
          return Fail("an unknown escape in a string");
      }
    }
  }

  bool Hex4(uint32_t* out) {
    if (pos_ + 4 > text_.size()) return Fail("a \\u escape needs four hex digits");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_ + i];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= c - '0';
      } else if (c >= 'a' && c <= 'f') {
        v |= c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        v |= c - 'A' + 10;
      } else {
        return Fail("a \\u escape needs four hex digits");
      }
    }
    pos_ += 4;
    *out = v;
    return true;
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp < 0x80) {
      out->push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else if (cp < 0x10000) {
      out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    } else {
      out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
      out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
    }
  }

  // RFC 8259's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
  bool ReadNumber(Value* out) {
    const size_t start = pos_;
    auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      return pos_ > from;
    };
    if (Peek('-')) ++pos_;
    if (Peek('0')) {
      ++pos_;
    } else if (!digits()) {
      pos_ = start;
      return Fail("expected a value");
    }
    if (Peek('.')) {
      ++pos_;
      if (!digits()) return Fail("expected a digit after '.'");
    }
    if (Peek('e') || Peek('E')) {
      ++pos_;
      if (Peek('+') || Peek('-')) ++pos_;
      if (!digits()) return Fail("expected a digit in the exponent");
    }
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    double v = 0;
    const absl::from_chars_result r = absl::from_chars(first, last, v);
    if (r.ec == std::errc::result_out_of_range) {
      // Too small rounds to zero as JSON readers do; too large has no double.
      v = std::strtod(std::string(first, last).c_str(), nullptr);
    } else if (r.ptr != last) {
      pos_ = start;
      return Fail("expected a value");
    }
    if (!std::isfinite(v)) {
      pos_ = start;
      return Fail("number out of range");
    }
    out->set_number_value(v);
    return true;
  }

  bool Literal(std::string_view word) {
    if (text_.substr(pos_, word.size()) != word) return Fail("expected a value");
    pos_ += word.size();
    return true;
  }

  bool Peek(char c) const { return pos_ < text_.size() && text_[pos_] == c; }

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  // Records the first problem, where it was found. Always false, for `return Fail(...)`.
  bool Fail(const std::string& what) {
    if (error_.ok()) {
      error_ = absl::InvalidArgumentError(absl::StrCat(what, " at byte ", pos_));
    }
    return false;
  }

  const std::string_view text_;
  const int max_depth_;
  size_t pos_ = 0;
  absl::Status error_;
};

}  // namespace

absl::Status ParseJsonObject(std::string_view text, Struct* out, int max_depth) {
  out->Clear();
  return JsonReader(text, max_depth).Document(out);
}

}  // namespace ddp
