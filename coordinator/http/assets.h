// The dashboard's static files (coordinator/http/assets/: HTML, CSS, JavaScript),
// compiled into the coordinator by embed_assets.cmake: the binary serves them itself,
// and nothing is loaded from the network.
#ifndef DDP_COORDINATOR_HTTP_ASSETS_H_
#define DDP_COORDINATOR_HTTP_ASSETS_H_

#include <string_view>
#include <vector>

namespace ddp {

struct EmbeddedAsset {
  const char* name;        // Its file name: "index.html", "dashboard.js".
  std::string_view bytes;  // The file's content, as it is in the source tree.
};

// Every asset, in no particular order (generated: embedded_assets.cc in the build tree).
const std::vector<EmbeddedAsset>& EmbeddedAssets();

// The asset named `name`, or nullptr.
const EmbeddedAsset* FindAsset(std::string_view name);

// The Content-Type for a file name's extension (text types in UTF-8).
const char* ContentTypeOf(std::string_view name);

}  // namespace ddp

#endif  // DDP_COORDINATOR_HTTP_ASSETS_H_
