// Exit codes of ddp-trainer, shared by the worker agent and the coordinator, which
// decide from them whether a failed attempt is worth restarting.
#ifndef DDP_COMMON_CONTRACT_EXIT_CODES_H_
#define DDP_COMMON_CONTRACT_EXIT_CODES_H_

namespace ddp {

// Training finished: every epoch ran and the final checkpoint (if any) is written.
inline constexpr int kExitOk = 0;
// A runtime failure that a restart may cure: a peer died, a collective timed out,
// the rendezvous failed, the disk was full. The coordinator restarts the job (up to
// max_restarts) and the trainers resume from the latest checkpoint.
inline constexpr int kExitRetryable = 1;
// The job can never succeed as written: invalid spec, missing data file, model that
// does not fit the data, checkpoint from another model. Never restarted.
inline constexpr int kExitPermanent = 2;
// This node cannot run the job but another may: the device it needs is not here.
// Retryable like 1; it also tells the coordinator which node is at fault.
inline constexpr int kExitNodeFault = 3;

inline bool IsRetryableExit(int code) { return code != kExitOk && code != kExitPermanent; }

}  // namespace ddp

#endif  // DDP_COMMON_CONTRACT_EXIT_CODES_H_
