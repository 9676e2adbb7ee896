#include "server/dashboard/assets.h"

namespace tandem::server {

const EmbeddedAsset* FindAsset(std::string_view name) {
  for (const auto& a : EmbeddedAssets()) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

std::string AssetContentType(std::string_view name) {
  if (name.ends_with(".html")) return "text/html; charset=utf-8";
  if (name.ends_with(".js")) return "text/javascript; charset=utf-8";
  if (name.ends_with(".css")) return "text/css; charset=utf-8";
  if (name.ends_with(".svg")) return "image/svg+xml";
  return "application/octet-stream";
}

}  // namespace tandem::server
