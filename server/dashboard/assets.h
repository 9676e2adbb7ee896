// The dashboard's static files (server/dashboard/static/), embedded in the
// binary at build time (embed_assets.cmake): nothing is read from disk, so
// a request path can name only these files.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::server {

struct EmbeddedAsset {
  std::string_view name;  // file name, e.g. "dashboard.js"
  std::string_view data;
};

// Generated.
const std::vector<EmbeddedAsset>& EmbeddedAssets();

// The asset called exactly `name`, or nullptr.
const EmbeddedAsset* FindAsset(std::string_view name);
// By extension: text/html, text/javascript, text/css, image/svg+xml, else application/octet-stream.
std::string AssetContentType(std::string_view name);

}  // namespace tandem::server
