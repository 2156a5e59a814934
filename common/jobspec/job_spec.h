// job.yaml as a validated C++ value.
//
// The one parser and validator of job files, shared by ddpctl (errors at submit
// time), the coordinator (re-validates what it stores) and ddp-trainer (reads the same
// file users submit). No LibTorch and no gRPC here.
//
// Names are job.yaml's, all documented in docs/job-spec.md (*ext*: ddp's extensions).
// Defaults follow PyTorch's where PyTorch has one (DataLoader drop_last=False,
// Adam lr=1e-3, AdamW weight_decay=1e-2, ...).
#ifndef DDP_COMMON_JOBSPEC_JOB_SPEC_H_
#define DDP_COMMON_JOBSPEC_JOB_SPEC_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "common/jobspec/labels.h"
#include "common/contract/lr_schedule.h"
#include "common/contract/optimizer_spec.h"

namespace ddp {

enum class Backend { kAuto, kNccl, kGloo };
enum class LossKind { kCrossEntropy, kMse, kBceWithLogits };
// fp32, or bf16: autocast to bfloat16 with fp32 master weights (torch.autocast's rule:
// matmuls and convolutions in bf16, reductions and losses in fp32).
enum class Precision { kFp32, kBf16 };
// train.comm_hook: PyTorch DDP's built-in communication hooks (libddp's
// <ddp/comm_hooks.h>): none, fp16_compress_hook, bf16_compress_hook, powerSGD_hook.
enum class CommHookKind { kNone, kFp16, kBf16, kPowerSgd };
// train.powersgd: PowerSGDState's arguments (comm_hook: powersgd only).
struct PowerSgdSpec {
  int64_t rank = 1;                 // matrix_approximation_rank
  int64_t start_iteration = 1000;   // start_powerSGD_iter
  double min_compression_rate = 2;
  bool error_feedback = true;       // use_error_feedback
  bool warm_start = true;
  double orthogonalization_epsilon = 0;
  int64_t random_seed = 0;
  bool batch_tensors_with_same_shape = false;
};
// How ranks on one node reduce gradients: auto (shared memory for CPU tensors when a
// node runs more than one rank, else the backend), shm (required), gloo (the backend).
enum class IntraNodeComm { kAuto, kShm, kGloo };
// Where a rank's model and collectives live: auto (cuda:LOCAL_RANK with NCCL when a GPU
// is visible and the backend allows it, else the CPU), cpu, or cuda (also with gloo:
// Gloo's CUDA path, which lets several ranks share one GPU, as NCCL does not).
enum class Device { kAuto, kCpu, kCuda };
// train.cuda_graph: the whole training step captured in one CUDA graph after a few eager
// warm-up steps and replayed (docs/trainer.md, CUDA graphs). auto: where the job allows
// it, else eager with the reason in the log; on: required (a job that cannot be captured
// is refused, naming why); off: eager.
enum class CudaGraphMode { kAuto, kOn, kOff };

struct NodeRange {
  int min = 1;
  int max = 1;
  bool elastic() const { return min != max; }
};

struct MlpSpec {
  std::vector<int64_t> hidden;  // Widths of the hidden Linear+ReLU layers.
};

// conv(k, pad k/2) + ReLU + maxpool(2) per entry of `channels`, then
// Linear(hidden) + ReLU + Linear(classes). Input: images [N, C, H, W].
struct CnnSpec {
  std::vector<int64_t> channels = {16, 32};
  int64_t kernel = 5;
  int64_t hidden = 128;
};

struct TorchScriptSpec {
  std::string path;  // A torch.jit.save()d module; its forward(x) returns the output.
};

// GPT-2 as nanoGPT's model.py writes it (docs/trainer.md, GPT): token and position
// embeddings, `layers` pre-LayerNorm blocks of causal self-attention (`heads` heads of
// dim / heads) and a 4x GELU(tanh) MLP, a final LayerNorm and the head over `vocab`
// tokens; GPT-2 124M by default. Trains on data.tokens with cross_entropy.
struct GptSpec {
  int64_t layers = 12;
  int64_t heads = 12;
  int64_t dim = 768;
  int64_t seq_len = 1024;  // The context (nanoGPT's block_size) and the window length.
  int64_t vocab = 50304;
  double dropout = 0.0;
  bool tie_weights = true;  // The head's weight is the token embedding's.
};

struct ModelSpec {
  enum class Kind { kMlp, kCnn, kTorchScript, kGpt };
  Kind kind = Kind::kMlp;
  MlpSpec mlp;
  CnnSpec cnn;
  TorchScriptSpec torchscript;
  GptSpec gpt;
};

struct CsvSpec {
  std::string path;
  int64_t skip_rows = 0;
  int64_t label_column = -1;  // Negative counts from the end.
  bool standardize = false;
};

struct IdxSpec {
  std::string images;  // IDX3 (uint8 images), ".gz" allowed.
  std::string labels;  // IDX1 (uint8 labels), ".gz" allowed.
};

struct SyntheticSpec {
  int64_t samples = 4096;
  int64_t features = 64;
  int64_t classes = 10;
};

// A flat little-endian file of token ids, nanoGPT's prepare.py format (train.bin).
enum class TokenDtype { kUint16, kUint32 };
struct TokensSpec {
  std::string path;
  TokenDtype dtype = TokenDtype::kUint16;
};

struct ValidationSpec {
  double fraction = 0.0;  // Held out from the training data (docs/trainer.md, Data split).
  bool has_idx = false;   // Or a separate IDX set (e.g. Fashion-MNIST's t10k files).
  IdxSpec idx;
  bool has_tokens = false;  // Or a second token file (with data.tokens; e.g. val.bin).
  TokensSpec tokens;        // dtype defaults to data.tokens.dtype.
};

struct DataSpec {
  enum class Kind { kCsv, kIdx, kSynthetic, kTokens };
  Kind kind = Kind::kCsv;
  CsvSpec csv;
  IdxSpec idx;
  SyntheticSpec synthetic;
  TokensSpec tokens;  // Samples are windows of model.gpt.seq_len + 1 tokens.
  ValidationSpec validation;
  int64_t seed = 0;
};

// train.optimizer is the contract's ddp::OptimizerSpec (common/contract/optimizer_spec.h),
// which the engine makes optimizers from.

// train.lr_schedule: the learning rate as torch.optim.lr_scheduler computes it,
// stepped every optimizer step or every epoch (`interval`), from the optimizer's lr:
//   step:    StepLR(step_size, gamma)
//   cosine:  CosineAnnealingLR(T_max = t_max, eta_min)
//   linear:  LinearLR(start_factor=1, end_factor, total_iters = t_max)
// after `warmup` intervals of LinearLR(warmup_start_factor, 1, total_iters = warmup),
// joined as SequentialLR([warm-up, main], milestones=[warmup]) joins them. t_max 0:
// the intervals left after the warm-up (epochs x steps per epoch, or epochs, capped by
// train.max_steps). The struct is the contract's ddp::LrSchedule
// (common/contract/lr_schedule.h); libddp's ddp::scheduled_lr is its closed form.

struct TrainSpec {
  int64_t epochs = 1;
  int64_t batch_size = 0;  // Per rank; required.
  bool drop_last = false;
  bool shuffle = true;
  OptimizerSpec optimizer;
  LossKind loss = LossKind::kCrossEntropy;
  double bucket_cap_mb = 25.0;
  // Cap of the first bucket (backward's last layers), PyTorch's
  // _DEFAULT_FIRST_BUCKET_BYTES: small so that communication starts early.
  double first_bucket_cap_mb = 1.0;
  int64_t grad_accum_steps = 1;
  int64_t seed = 0;
  // torch.nn.utils.clip_grad_norm_(max_norm, L2) after the all-reduce, before the
  // optimizer step; 0: no clipping.
  double clip_grad_norm = 0.0;
  LrSchedule lr_schedule;
  double collective_timeout_s = 300.0;
  // The coordinator's stall watchdog: a running rank that reports no progress for
  // this long fails the attempt, naming it. 0: chosen from the step reports seen
  // (coordinator/core/stall_watchdog.h).
  double stall_timeout_s = 0.0;
  int64_t threads = 0;    // Intra-op threads per rank; 0: cores / LOCAL_WORLD_SIZE.
  int64_t max_steps = 0;  // Stop after this many optimizer steps in total; 0: no cap.
  Precision precision = Precision::kFp32;
  IntraNodeComm intra_node_comm = IntraNodeComm::kAuto;
  Device device = Device::kAuto;
  CommHookKind comm_hook = CommHookKind::kNone;
  PowerSgdSpec powersgd;
  CudaGraphMode cuda_graph = CudaGraphMode::kAuto;
};

struct RdzvSpec {
  double last_call_s = 5.0;  // Elastic jobs: wait this long past `min` for more nodes.
  double timeout_s = 120.0;  // Trainers must all connect within this.
};

// checkpoint.resume: start from the newest checkpoint any rank holds (kYes), never
// (kNo), or even from one another job wrote (kForce; kYes refuses it).
enum class ResumePolicy { kNo, kYes, kForce };

struct CheckpointSpec {
  // Empty: no checkpoints. {job_id} and {node} are replaced by the trainer.
  std::string dir;
  int64_t every_epochs = 0;
  int64_t every_steps = 0;
  int64_t keep = 2;  // Checkpoints each writer keeps, newest first.
  ResumePolicy resume = ResumePolicy::kYes;
  // Training waits only for a copy of the state in host memory; a background writer
  // serializes and writes it (decision 192). false: every rank waits for the write.
  bool async = true;
};

struct MetricsSpec {
  int64_t every_steps = 1;
  bool trace_buckets = false;  // Emit a `trace` event per step (reducer timeline).
};

// job.yaml `tracking`: where the coordinator sends the job's metrics besides its store
// (docs/job-spec.md). Unset: the coordinator's own default (--mlflow-uri: every job).
struct TrackingSpec {
  enum class Mlflow { kDefault, kOn, kOff };
  Mlflow mlflow = Mlflow::kDefault;
  std::string mlflow_uri;         // Empty: the coordinator's --mlflow-uri.
  std::string mlflow_experiment;  // Empty: the job's name.
};

// A job runs either the built-in trainer (model, data, train, checkpoint, metrics)
// or the user's own program (`command`: an argv, run once per rank with torchrun's
// environment; docs/command-jobs.md). Exactly one of the two.
// job.yaml `preemption`: how a higher-priority job may take this job's nodes
// (docs/scheduling.md). kAtCheckpoint: after the job's next checkpoint, resuming
// from it (a job that takes no periodic checkpoints is then never preempted); kKill:
// at once, from its last checkpoint if any; kNever.
enum class PreemptionPolicy { kAtCheckpoint, kKill, kNever };

struct JobSpec {
  std::string name;
  std::string rdzv_id;  // Empty: the job id.
  // Scheduling (docs/scheduling.md): the queue serves higher priorities first, in
  // submission order within one; the job runs only on workers whose labels match
  // every entry of node_selector.
  int priority = 0;
  Labels node_selector;
  PreemptionPolicy preemption = PreemptionPolicy::kAtCheckpoint;
  // job.yaml `preemption_notice_s` (kKill only; 0: none): a `kill` job chosen for
  // preemption is first asked for a checkpoint (the checkpoint-now notice) and moves
  // after it, or once this many seconds have passed without one (decision 189).
  double preemption_notice_s = 0;
  NodeRange nodes;
  int nproc_per_node = 1;  // 0 means "auto": one per GPU, 1 on CPU.
  Backend backend = Backend::kAuto;
  int max_restarts = 0;
  // Live recovery (docs/recovery.md): a failed rank is replaced while the others keep
  // their processes and state, up to max_recoveries times over the job; a recovery
  // not done within recovery_timeout_s falls back to a restart (max_restarts).
  int max_recoveries = 0;
  double recovery_timeout_s = 60.0;
  // SIGTERM to SIGKILL for this job's ranks when they are stopped; 0: the worker's
  // --stop-grace, which also bounds it (it is set within the platform's grace).
  double stop_grace_s = 0.0;
  // Command jobs: a signal sent to each rank's process with every checkpoint-now notice
  // (0: none; the notice file and DDP_NOTICE_FILE always are).
  int notice_signal = 0;
  std::string workdir;  // Trainers' working directory; relative paths resolve here.
  std::map<std::string, std::string> env;  // Extra environment for the trainers.
  // Non-empty: a command job. argv[0] is an absolute path, a path relative to the
  // workdir (it holds a '/'), or a name looked up in the worker's PATH. The sections
  // of the built-in trainer below then keep their defaults, except
  // train.stall_timeout_s (the top-level `stall_timeout_s` of a command job) and
  // train.collective_timeout_s (kCommandCollectiveTimeoutS).
  std::vector<std::string> command;
  bool is_command() const { return !command.empty(); }
  ModelSpec model;
  DataSpec data;
  TrainSpec train;
  RdzvSpec rdzv;
  CheckpointSpec checkpoint;
  MetricsSpec metrics;
  TrackingSpec tracking;
};

// Limits (docs/job-spec.md). The size is checked before the YAML is parsed, so an
// oversized file costs nothing; every number has an upper bound, so no product or
// sum of fields overflows in the trainer.
inline constexpr size_t kMaxSpecBytes = 64 * 1024;
inline constexpr size_t kMaxStringBytes = 4096;    // Paths, env values.
inline constexpr size_t kMaxListEntries = 64;      // hidden, channels.
inline constexpr size_t kMaxEnvEntries = 256;
inline constexpr int64_t kMaxWidth = 65536;        // A hidden layer's or CNN's width.
inline constexpr int64_t kMaxNodes = 4096;
inline constexpr int64_t kMaxProcPerNode = 1024;
inline constexpr int64_t kMaxRestarts = 1000;
inline constexpr double kMaxRecoveryTimeoutS = 3600;
// The longest checkpoint-now notice a `kill` job may ask for before it is preempted.
inline constexpr double kMaxPreemptionNoticeS = 3600;
inline constexpr int64_t kMaxEpochs = 1000000;
inline constexpr int64_t kMaxBatchSize = 1 << 20;
inline constexpr int64_t kMaxGradAccumSteps = 65536;
inline constexpr int64_t kMaxSteps = int64_t{1} << 40;   // max_steps, every_steps.
inline constexpr int64_t kMaxSeed = int64_t{1} << 53;    // |seed|; seed + epoch never overflows.
inline constexpr int64_t kMaxRows = int64_t{1} << 31;    // skip_rows, samples, |label_column|.
inline constexpr int64_t kMaxFeatures = 1 << 20;         // synthetic features, classes.
inline constexpr int64_t kMaxSyntheticValues = int64_t{1} << 30;  // samples * features.
inline constexpr int64_t kMaxThreads = 1024;
// model.gpt: each field's bound, and the parameter count of the whole (embeddings,
// blocks, head) at most 2^40 (1.1 trillion), so that no size the trainer derives from
// it (bytes, FLOPs per token) overflows.
inline constexpr int64_t kMaxGptLayers = 1024;
inline constexpr int64_t kMaxGptHeads = 1024;
inline constexpr int64_t kMaxSeqLen = int64_t{1} << 20;
inline constexpr int64_t kMaxVocab = int64_t{1} << 24;
inline constexpr int64_t kMaxGptParameters = int64_t{1} << 40;
inline constexpr double kMaxBucketCapMb = 65536;
inline constexpr double kMaxCollectiveTimeoutS = 7 * 24 * 3600.0;
inline constexpr double kMaxRdzvTimeoutS = 24 * 3600.0;
inline constexpr double kMaxLastCallS = 3600.0;
inline constexpr double kMaxOptimizerValue = 1e6;        // lr, weight_decay, eps.
inline constexpr size_t kMaxCommandArgs = 1024;          // command: argv entries.
inline constexpr int64_t kMaxPriority = 1000;             // |priority|.
// A command job's collective timeout, for ordering the stall watchdog's: PyTorch's
// default process-group timeout (30 minutes), which the program may change.
inline constexpr double kCommandCollectiveTimeoutS = 1800.0;

// Parses and validates YAML text. `source` names it in messages ("job.yaml").
// On error returns INVALID_ARGUMENT whose message has one line per problem, each
// "<source>:<line>: <field.path>: <what is wrong>", e.g.
//   job.yaml:14: train.batch_size: must be > 0 (got 0)
// or RESOURCE_EXHAUSTED when the text is over kMaxSpecBytes (nothing is parsed).
// Text that is not UTF-8, control characters, and a field given twice are errors.
absl::StatusOr<JobSpec> ParseJobSpec(const std::string& yaml_text,
                                     const std::string& source = "job.yaml");
// Reads then parses a file; NOT_FOUND if it cannot be read.
absl::StatusOr<JobSpec> LoadJobSpecFile(const std::string& path);

const char* BackendName(Backend b);
const char* LossName(LossKind l);
const char* OptimizerName(OptimizerKind o);
const char* IntraNodeCommName(IntraNodeComm c);
const char* DeviceName(Device d);
const char* CudaGraphModeName(CudaGraphMode m);  // "auto", "true", "false"
const char* LrScheduleName(LrSchedule::Kind k);
const char* TokenDtypeName(TokenDtype d);  // "uint16", "uint32"
// The parameters of model.gpt `g`, as PyTorch counts them (a tied head once).
int64_t GptParameterCount(const GptSpec& g);
// "2" or "1:4".
std::string NodeRangeString(const NodeRange& r);

}  // namespace ddp

#endif  // DDP_COMMON_JOBSPEC_JOB_SPEC_H_
