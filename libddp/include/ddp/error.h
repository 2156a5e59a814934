// ddp::Error: what every call of the library throws when it cannot do its job.
//
// The message says what went wrong and what to do ("WORLD_SIZE: expected an integer
// >= 1, got 'x'", "gradient bucket 0: ... peer ..."). code() classifies it, and
// exit_code() follows ddp-trainer's exit codes (1 retryable, 2 permanent), so a
// program's main can end with
//
//   catch (const ddp::Error& e) { std::cerr << e.what() << "\n"; return e.exit_code(); }
//
// Under a command job ddp restarts the job after any nonzero exit (torchrun's rule, up
// to max_restarts) and the program resumes from its checkpoint; the code tells a
// supervisor of its own (or a person reading the exit status) whether a retry can help.
#ifndef DDP_ERROR_H_
#define DDP_ERROR_H_

#include <stdexcept>
#include <string>

namespace ddp {

enum class ErrorCode {
  kInvalidArgument,     // Bad input: the environment, an option, a model the call cannot take.
  kFailedPrecondition,  // Cannot work here as asked (NCCL without a GPU, say).
  kUnavailable,         // A peer died or hung, the rendezvous timed out: worth a restart.
  kDeadlineExceeded,    // A wait ran past its timeout.
  kResourceExhausted,   // Out of memory or disk.
  kInternal,            // A LibTorch or c10d failure not classified above.
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message, int exit_code);
  ErrorCode code() const noexcept { return code_; }
  // 1 (retryable: a peer was lost, a timeout) or 2 (permanent: bad input).
  int exit_code() const noexcept { return exit_code_; }
  // Whether restarting the job (from its last checkpoint) may succeed.
  bool retryable() const noexcept { return exit_code_ != 2; }

 private:
  ErrorCode code_;
  int exit_code_;
};

}  // namespace ddp

#endif  // DDP_ERROR_H_
