// Waiting for the rendezvous store's listener before connecting to it.
//
// c10d::TCPStore's client sleeps a fixed second after each refused connection
// (LibTorch 1.13, and 2.x before its backoff), and rank 0 opens the store a little
// after the other ranks are ready: a whole second lost at every job start. Probing
// the port every few milliseconds lets the store client connect at its first try.
// No LibTorch here.
#ifndef DDP_LIBDDP_ENGINE_STORE_PROBE_H_
#define DDP_LIBDDP_ENGINE_STORE_PROBE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ddp {

// Returns OK as soon as a TCP connection to host:port succeeds (the probe connection
// is closed at once), retrying every 2 ms at first and every 50 ms at most;
// DEADLINE_EXCEEDED after `timeout`; INVALID_ARGUMENT if the host does not resolve.
absl::Status WaitForTcpListener(const std::string& host, int port, absl::Duration timeout);

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_STORE_PROBE_H_
