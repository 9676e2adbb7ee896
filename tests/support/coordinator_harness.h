// Test support (tests/support): the parts every in-process coordinator test
// repeats: a fresh per-test directory with token files, a coordinator config
// on 127.0.0.1 (ephemeral port) rooted there, and bounded Control calls
// (submit, get, wait for a predicate). Failures are reported with gtest
// (ADD_FAILURE / EXPECT), never thrown.
#ifndef TANDEM_TESTS_SUPPORT_COORDINATOR_HARNESS_H_
#define TANDEM_TESTS_SUPPORT_COORDINATOR_HARNESS_H_

#include <functional>
#include <string>

#include "tandem/v1/config.pb.h"
#include "tandem/v1/control.grpc.pb.h"

namespace tandem::test_support {

// TempDir()/<prefix>_<pid>_<current test name>, emptied and created.
std::string FreshTestDir(const std::string& prefix);

// Writes dir/admin.tok and dir/join.tok and returns the default coordinator
// config listening on 127.0.0.1:0 (no metrics endpoint) with its state and
// runs under dir. Tests tune the timeouts on the result.
tandem::v1::CoordinatorConfig TestCoordinatorConfig(const std::string& dir, const std::string& admin_token,
                                                    const std::string& join_token);

// Control calls with the admin token; each bounded by a 5 s deadline.
std::string SubmitJob(tandem::v1::Control::Stub* control, const std::string& token, const tandem::v1::JobSpec& spec);
tandem::v1::Job GetJob(tandem::v1::Control::Stub* control, const std::string& token, const std::string& id);
// Polls GetJob every poll_ms until pred holds or ms pass (then ADD_FAILURE).
tandem::v1::Job WaitForJob(tandem::v1::Control::Stub* control, const std::string& token, const std::string& id,
                           const std::function<bool(const tandem::v1::Job&)>& pred, int ms, int poll_ms);
// Polls ListWorkers every poll_ms until the worker named `name` is in
// `state`, at most ms (then ADD_FAILURE); returns whether it got there.
bool WaitForWorker(tandem::v1::Control::Stub* control, const std::string& token, const std::string& name,
                   tandem::v1::WorkerState state, int ms, int poll_ms);

}  // namespace tandem::test_support

#endif  // TANDEM_TESTS_SUPPORT_COORDINATOR_HARNESS_H_
