// A tiny JSON object writer with no dependencies, for ddp-trainer's event lines
// (the trainer links neither protobuf nor gRPC). Keys keep insertion order.
//
//   JsonObject e;
//   e.Add("type", "step").Add("rank", 0).Add("loss", 0.693);
//   write(fd, e.Line());   // {"type":"step","rank":0,"loss":0.693}\n
#ifndef DDP_COMMON_JSON_WRITER_H_
#define DDP_COMMON_JSON_WRITER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ddp {

// Escapes `s` as the body of a JSON string (no surrounding quotes). Invalid UTF-8
// becomes U+FFFD, so the output is always valid JSON text.
std::string JsonEscape(std::string_view s);
// The shortest decimal that round-trips `v`; "null" for NaN and infinities.
std::string JsonNumber(double v);

class JsonObject {
 public:
  JsonObject& Add(std::string_view key, std::string_view value);
  JsonObject& Add(std::string_view key, const char* value) {
    return Add(key, std::string_view(value));
  }
  JsonObject& Add(std::string_view key, const std::string& value) {
    return Add(key, std::string_view(value));
  }
  JsonObject& Add(std::string_view key, int64_t value);
  JsonObject& Add(std::string_view key, int value) { return Add(key, int64_t{value}); }
  JsonObject& Add(std::string_view key, double value);
  JsonObject& Add(std::string_view key, bool value);
  JsonObject& AddNull(std::string_view key);
  // `json` must already be valid JSON (an object or array built elsewhere).
  JsonObject& AddRaw(std::string_view key, std::string_view json);

  std::string str() const { return "{" + body_ + "}"; }
  std::string Line() const { return str() + "\n"; }

 private:
  void Key(std::string_view key);
  std::string body_;
};

// Joins already-encoded JSON values into an array.
std::string JsonArray(const std::vector<std::string>& encoded_items);

}  // namespace ddp

#endif  // DDP_COMMON_JSON_WRITER_H_
