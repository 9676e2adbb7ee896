// Backend constructors behind MakeCollective (collective.cc). Internal to
// worker/comm; use MakeCollective.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "worker/comm/collective.h"

namespace tandem::comm {

absl::StatusOr<std::unique_ptr<Collective>> MakeGlooCollective(Store& store, int rank, int size,
                                                               const CollectiveOptions& options);

#if defined(TANDEM_HAVE_NCCL)
absl::StatusOr<std::unique_ptr<Collective>> MakeNcclCollective(Store& store, int rank, int size,
                                                               const CollectiveOptions& options);
#endif

}  // namespace tandem::comm
