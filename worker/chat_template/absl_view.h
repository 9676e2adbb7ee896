// AV(): a std::string_view as an absl::string_view. Debian's Abseil has its
// own string_view type, so absl::StrCat needs this.
#pragma once

#include <string_view>

#include "absl/strings/string_view.h"

namespace tandem::chat_template {
inline absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }
}  // namespace tandem::chat_template
