// MakeGuardedCollective: a host-memory Collective (Gloo) that also accepts
// guarded device pointers (kernels/guarded/guarded_memory.h).
//
// Every buffer argument is translated with GuardedMemory::Real(..., bytes,
// what, /*allow_host=*/true): guarded device pointers become their real
// storage (bounds-checked: a range outside one live allocation aborts), host
// pointers pass through unchanged. Status, timeouts and Abort() are the
// inner communicator's; byte accounting is forwarded (each call adds the
// inner's per-kind delta to this object's counts). `memory` must outlive the
// returned object. Thread safety as Collective.
#pragma once

#include <memory>

#include "kernels/guarded/guarded_memory.h"
#include "worker/comm/collective.h"

namespace tandem::comm {

std::unique_ptr<Collective> MakeGuardedCollective(std::unique_ptr<Collective> inner, kernels::GuardedMemory* memory);

}  // namespace tandem::comm
