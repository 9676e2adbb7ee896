// ParamProvider: where the model gets each unit's parameters and gradient
// buffers. A "unit" is a contiguous slice of the flat parameter layout:
//   unit 0            token embedding (and the LM head when tied)
//   units 1..L        decoder layer i-1 (norms, q/k/v/o (+biases), gate/up/down)
//   unit L+1          final norm (+ lm_head when untied)
// Named views (worker/model/param_layout.h) give each tensor's offset inside
// its unit, so a unit can live in a full flat buffer (ZeRO 0-2) or in a
// temporary gathered buffer (ZeRO-3) without the model knowing.
//
// Call pattern (one thread): forward acquires unit 0, 1..L, L+1 in order and
// releases each after use; backward acquires L+1, L..1, 0 (params and grads)
// and releases each grad unit once its gradient is complete, which lets
// ZeRO-2/3 reduce-scatter it while the rest of the backward runs. Prefetch
// hints say which unit comes next. Acquire calls may nest for unit 0 (tied
// embeddings are used at both ends): providers reference-count.
#pragma once

#include <cstddef>

namespace tandem::model {

class ParamProvider {
 public:
  virtual ~ParamProvider() = default;
  // Parameters of `unit`, valid until the matching ReleaseParams.
  virtual const float* AcquireParams(int unit) = 0;
  virtual void ReleaseParams(int unit) = 0;
  // Gradient accumulator of `unit` (the model ADDS into it), valid until the
  // matching ReleaseGrads. Release means the unit's gradient for this
  // micro-batch is complete.
  virtual float* AcquireGrads(int unit) = 0;
  virtual void ReleaseGrads(int unit) = 0;
  // Hint: `unit` will be acquired next (forward or backward order).
  virtual void Prefetch(int unit) {}
};

}  // namespace tandem::model
