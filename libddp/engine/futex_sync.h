// Spin-then-futex waiting on shared memory, across processes.
//
// A FutexWord lives in a shared-memory segment: a 32-bit sequence number that
// publishers bump, and a count of sleepers. A publisher changes some shared state,
// then calls Notify(): it bumps the sequence and, only when a waiter sleeps, wakes
// it with FUTEX_WAKE, so ranks that arrive in lockstep never enter the kernel.
// A waiter calls Await(): it spins for a short while (a peer in lockstep answers
// within microseconds), then sleeps in FUTEX_WAIT, so a rank that waits long leaves
// its core to the ranks that compute. Asleep, it wakes on every Notify() and at least
// every `tick` to run `check` (deadline, aborted group, dead peers).
//
// The lost-wakeup race is closed Dekker-style: the waiter announces itself (sleepers)
// before reading the sequence and re-testing `ready`; the publisher bumps the
// sequence before reading sleepers; all four are sequentially consistent, so either
// the waiter sees the new state or the publisher sees the sleeper (and FUTEX_WAIT
// returns at once because the sequence moved).
//
// No LibTorch here.
#ifndef DDP_LIBDDP_ENGINE_FUTEX_SYNC_H_
#define DDP_LIBDDP_ENGINE_FUTEX_SYNC_H_

#include <atomic>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

namespace ddp {

struct alignas(64) FutexWord {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> sleepers{0};
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);

struct AwaitOptions {
  absl::Duration spin = absl::Microseconds(50);  // Busy-wait this long before sleeping.
  absl::Duration tick = absl::Milliseconds(20);  // Longest sleep between `check`s.
};

// Wakes every waiter of `word` (after the caller published its change).
void Notify(FutexWord& word);

// Returns OK once `ready()` holds, or the first non-OK status of `check()`, which runs
// before every sleep. `ready` must read the shared state with acquire loads.
absl::Status Await(FutexWord& word, absl::FunctionRef<bool()> ready,
                   absl::FunctionRef<absl::Status()> check, const AwaitOptions& options);

}  // namespace ddp

#endif  // DDP_LIBDDP_ENGINE_FUTEX_SYNC_H_
