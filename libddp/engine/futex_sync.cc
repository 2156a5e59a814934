#include "libddp/engine/futex_sync.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <climits>

namespace ddp {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

uint32_t* Address(FutexWord& word) {
  // std::atomic<uint32_t> is a plain lock-free 32-bit word: the futex can use it.
  return reinterpret_cast<uint32_t*>(&word.seq);
}

}  // namespace

void Notify(FutexWord& word) {
  word.seq.fetch_add(1, std::memory_order_seq_cst);
  if (word.sleepers.load(std::memory_order_seq_cst) > 0) {
    // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
    ::syscall(SYS_futex, Address(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
  }
}

absl::Status Await(FutexWord& word, absl::FunctionRef<bool()> ready,
                   absl::FunctionRef<absl::Status()> check, const AwaitOptions& options) {
  if (ready()) return absl::OkStatus();
  const absl::Time spin_end = absl::Now() + options.spin;
  do {
    for (int i = 0; i < 64; ++i) {
      CpuRelax();
      if (ready()) return absl::OkStatus();
    }
  } while (absl::Now() < spin_end);

  const timespec tick = absl::ToTimespec(options.tick);
  word.sleepers.fetch_add(1, std::memory_order_seq_cst);
  absl::Status status;
  while (true) {
    const uint32_t seen = word.seq.load(std::memory_order_seq_cst);
    if (ready()) break;
    status = check();
    if (!status.ok()) break;
    // Returns on a wake, on the tick, or at once if the sequence moved since `seen`.
    ::syscall(SYS_futex, Address(word), FUTEX_WAIT, seen, &tick, nullptr, 0);
  }
  word.sleepers.fetch_sub(1, std::memory_order_seq_cst);
  return status;
}

}  // namespace ddp
