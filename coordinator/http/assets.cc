#include "coordinator/http/assets.h"

namespace ddp {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

const EmbeddedAsset* FindAsset(std::string_view name) {
  for (const EmbeddedAsset& asset : EmbeddedAssets()) {
    if (name == asset.name) return &asset;
  }
  return nullptr;
}

const char* ContentTypeOf(std::string_view name) {
  if (EndsWith(name, ".html")) return "text/html; charset=utf-8";
  if (EndsWith(name, ".css")) return "text/css; charset=utf-8";
  if (EndsWith(name, ".js")) return "text/javascript; charset=utf-8";
  if (EndsWith(name, ".svg")) return "image/svg+xml";
  if (EndsWith(name, ".png")) return "image/png";
  return "application/octet-stream";
}

}  // namespace ddp
