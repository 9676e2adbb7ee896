// Bounds that keep a hostile template from exhausting the process: every
// one is checked, and exceeding it fails the parse or render with an error
// that names the limit (ResourceExhausted) and the template line. At these
// defaults a render needs well under 256 KiB of stack.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::chat_template {

struct Limits {
  // Depth of the parse: each nested block counts one, each nested bracket
  // or operator a few (about 40 levels of parentheses fit); real templates
  // stay far below.
  int max_nesting = 128;
  // Macro calls in progress at once (recursion).
  int max_call_depth = 64;
  // Bytes of rendered output, and of any one string a template builds.
  size_t max_output_bytes = size_t{16} << 20;
  // Loop iterations in one render, all loops together; also the most items
  // of any one list a template builds.
  int64_t max_loop_iterations = 1'000'000;
  // Evaluation steps in one render (one per expression or statement, plus
  // one per 64 bytes copied into new strings): bounds total work.
  int64_t max_steps = 50'000'000;
};

}  // namespace tandem::chat_template
