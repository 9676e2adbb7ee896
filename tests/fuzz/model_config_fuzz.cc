// Fuzz target: a Hugging Face config.json (worker/model/config.h), as read
// from every model directory. The input is the file's text. A config that
// parses must pass Validate(), give a parameter layout, and survive the
// round trip through ToConfigJson (what SaveModelDir writes must load
// again, unchanged); a config that does not parse must fail with a Status.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "tests/fuzz/fuzz_util.h"
#include "worker/model/config.h"
#include "worker/model/param_layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::model;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto config = ParseConfigJson(text);
  if (!config.ok()) return 0;
  if (absl::Status st = Validate(*config); !st.ok()) {
    tandem::fuzz::Fail("a parsed config fails Validate: " + st.ToString());
  }
  (void)ParameterCount(*config);
  (void)ParamLayout(*config).total_floats();
  for (int layer = 0; layer < config->num_hidden_layers; ++layer) (void)config->LayerWindow(layer);
  (void)config->Rope();
  const std::string written = ToConfigJson(*config);
  auto again = ParseConfigJson(written);
  if (!again.ok()) {
    tandem::fuzz::Fail("ToConfigJson wrote a config.json that does not parse: " + again.status().ToString() + "\n" +
                       written);
  }
  if (ToConfigJson(*again) != written) {
    tandem::fuzz::Fail("config.json changes in the round trip:\n" + written + "\n" + ToConfigJson(*again));
  }
  return 0;
}
