// Facts about the machine a worker runs on, for RegisterWorker and
// Heartbeat: host name, physical memory, this process's resident memory, and
// the local address that routes to the coordinator (the default data
// address peers use for collectives). Plain reads of /proc and sockets;
// thread safe; failures fall back to empty/zero values, never throw.
#pragma once

#include <cstdint>
#include <string>

namespace tandem::worker {

std::string HostName();
// MemTotal from /proc/meminfo, in bytes (0 when unknown).
int64_t PhysicalMemoryBytes();
// What this process may use: physical memory, lowered by RLIMIT_AS and the
// cgroup's memory limit. Reported at registration (the coordinator checks
// jobs' memory estimates against it).
int64_t UsableMemoryBytes();
// Resident set size of this process, in bytes (0 when unknown).
int64_t ResidentMemoryBytes();
// The local IPv4 address the kernel would use to reach host:port (a UDP
// connect, no packet sent). "127.0.0.1" when it cannot be determined.
std::string LocalAddressTowards(const std::string& host_port);

}  // namespace tandem::worker
