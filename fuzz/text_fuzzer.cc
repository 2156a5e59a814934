// libFuzzer target: bytes -> the coordinator's token-file parser and ddpctl's terminal
// sanitizer. The sanitizer's output must hold no ESC or other C0 control byte except
// tab and newline, and be valid for a second pass unchanged.
#include <cstddef>
#include <cstdint>
#include <string>

#include "client/sanitize.h"
#include "common/auth/tokens.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto table = ddp::TokenTable::Parse(text, "tokens");
  if (table.ok()) (void)table->Find(text);
  const std::string clean = ddp::SanitizeText(text);
  for (unsigned char c : clean) {
    if ((c < 0x20 && c != '\t' && c != '\n') || c == 0x7f) __builtin_trap();
  }
  if (ddp::SanitizeText(clean) != clean) __builtin_trap();
  return 0;
}
