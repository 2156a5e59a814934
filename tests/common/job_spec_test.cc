#include "common/jobspec/job_spec.h"

#include <signal.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/status_matchers.h"

namespace ddp {
namespace {

using ::ddp::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The original job.yaml contract's example, verbatim (docs/job-spec.md).
constexpr char kDesignExample[] = R"(name: cancer-ddp
rdzv_id: cancer-2026        # optional; default: the job id. A live rdzv_id can't be reused.
nodes: 2                    # or "1:4" (elastic min:max)
nproc_per_node: 1           # or auto: one per GPU, 1 on CPU
backend: auto               # auto | nccl | gloo
max_restarts: 3
model:
  mlp: {hidden: [64, 32]}   # or cnn: {...}, or torchscript: {path: model.pt}
data:
  csv: {path: breast_cancer.csv, skip_rows: 1, label_column: -1, standardize: true}
  validation: {fraction: 0.2}
  seed: 0
train:
  epochs: 10
  batch_size: 8             # per rank
  drop_last: true
  shuffle: true
  optimizer: {name: adam, lr: 0.001}   # sgd (momentum), adam, adamw
  loss: cross_entropy
  bucket_cap_mb: 25
  grad_accum_steps: 1
  seed: 0
checkpoint: {dir: ./checkpoints/cancer, every_epochs: 1}
metrics: {every_steps: 1}
)";

TEST(JobSpecTest, ParsesTheDesignExample) {
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec spec, ParseJobSpec(kDesignExample));
  EXPECT_EQ(spec.name, "cancer-ddp");
  EXPECT_EQ(spec.rdzv_id, "cancer-2026");
  EXPECT_EQ(spec.nodes.min, 2);
  EXPECT_EQ(spec.nodes.max, 2);
  EXPECT_EQ(spec.nproc_per_node, 1);
  EXPECT_EQ(spec.backend, Backend::kAuto);
  EXPECT_EQ(spec.max_restarts, 3);
  EXPECT_EQ(spec.model.kind, ModelSpec::Kind::kMlp);
  EXPECT_EQ(spec.model.mlp.hidden, (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(spec.data.kind, DataSpec::Kind::kCsv);
  EXPECT_EQ(spec.data.csv.path, "breast_cancer.csv");
  EXPECT_EQ(spec.data.csv.skip_rows, 1);
  EXPECT_EQ(spec.data.csv.label_column, -1);
  EXPECT_TRUE(spec.data.csv.standardize);
  EXPECT_DOUBLE_EQ(spec.data.validation.fraction, 0.2);
  EXPECT_EQ(spec.train.epochs, 10);
  EXPECT_EQ(spec.train.batch_size, 8);
  EXPECT_TRUE(spec.train.drop_last);
  EXPECT_EQ(spec.train.optimizer.kind, OptimizerKind::kAdam);
  EXPECT_DOUBLE_EQ(spec.train.optimizer.lr, 0.001);
  EXPECT_EQ(spec.train.loss, LossKind::kCrossEntropy);
  EXPECT_DOUBLE_EQ(spec.train.bucket_cap_mb, 25);
  EXPECT_EQ(spec.checkpoint.dir, "./checkpoints/cancer");
  EXPECT_EQ(spec.checkpoint.every_epochs, 1);
  EXPECT_EQ(spec.metrics.every_steps, 1);
}

TEST(JobSpecTest, AppliesPyTorchDefaults) {
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec spec, ParseJobSpec(R"(
name: d
model: {mlp: {}}
data: {synthetic: {}}
train: {batch_size: 4}
)"));
  EXPECT_FALSE(spec.train.drop_last);
  EXPECT_TRUE(spec.train.shuffle);
  EXPECT_EQ(spec.train.optimizer.kind, OptimizerKind::kAdam);
  EXPECT_DOUBLE_EQ(spec.train.optimizer.lr, 1e-3);
  EXPECT_EQ(spec.train.grad_accum_steps, 1);
  EXPECT_DOUBLE_EQ(spec.train.bucket_cap_mb, 25);
  EXPECT_EQ(spec.max_restarts, 0);
  EXPECT_EQ(spec.data.synthetic.samples, 4096);
  EXPECT_TRUE(spec.checkpoint.dir.empty());
}

TEST(JobSpecTest, AdamWDefaultsToPyTorchWeightDecay) {
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec spec, ParseJobSpec(R"(
name: d
model: {mlp: {}}
data: {synthetic: {}}
train: {batch_size: 4, optimizer: {name: adamw}}
)"));
  EXPECT_DOUBLE_EQ(spec.train.optimizer.weight_decay, 1e-2);
}

TEST(JobSpecTest, ZeroBatchSizeNamesTheFieldAndItsLine) {
  auto spec = ParseJobSpec("name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\ntrain:\n"
                           "  epochs: 2\n  batch_size: 0\n",
                           "job.yaml");
  EXPECT_THAT(spec, StatusIs(absl::StatusCode::kInvalidArgument,
                             HasSubstr("job.yaml:6: train.batch_size: must be > 0 (got 0)")));
}

TEST(JobSpecTest, PrecisionIsFp32OrBf16) {
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec fp32, ParseJobSpec("name: d\nmodel: {mlp: {}}\n"
                                                      "data: {synthetic: {}}\n"
                                                      "train: {batch_size: 8}\n"));
  EXPECT_EQ(fp32.train.precision, Precision::kFp32);
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec bf16, ParseJobSpec("name: d\nmodel: {mlp: {}}\n"
                                                      "data: {synthetic: {}}\n"
                                                      "train: {batch_size: 8, precision: bf16}\n"));
  EXPECT_EQ(bf16.train.precision, Precision::kBf16);
  auto fp16 = ParseJobSpec("name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                           "train:\n  batch_size: 8\n  precision: fp16\n");
  EXPECT_THAT(fp16, StatusIs(absl::StatusCode::kInvalidArgument,
                             HasSubstr("job.yaml:6: train.precision: must be fp32 or bf16 "
                                       "(got 'fp16')")));
}

TEST(JobSpecTest, CommHookAndPowerSgdOptions) {
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec none, ParseJobSpec("name: d\nmodel: {mlp: {}}\n"
                                                      "data: {synthetic: {}}\n"
                                                      "train: {batch_size: 8}\n"));
  EXPECT_EQ(none.train.comm_hook, CommHookKind::kNone);
  EXPECT_EQ(none.train.powersgd.start_iteration, 1000);  // PyTorch's defaults.
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec fp16, ParseJobSpec("name: d\nmodel: {mlp: {}}\n"
                                                      "data: {synthetic: {}}\n"
                                                      "train: {batch_size: 8, comm_hook: fp16}\n"));
  EXPECT_EQ(fp16.train.comm_hook, CommHookKind::kFp16);
  DDP_ASSERT_OK_AND_ASSIGN(
      JobSpec psgd,
      ParseJobSpec("name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                   "train:\n  batch_size: 8\n  comm_hook: powersgd\n"
                   "  powersgd: {rank: 2, start_iteration: 10, warm_start: false,\n"
                   "             min_compression_rate: 1.5, random_seed: 7}\n"));
  EXPECT_EQ(psgd.train.comm_hook, CommHookKind::kPowerSgd);
  EXPECT_EQ(psgd.train.powersgd.rank, 2);
  EXPECT_EQ(psgd.train.powersgd.start_iteration, 10);
  EXPECT_FALSE(psgd.train.powersgd.warm_start);
  EXPECT_TRUE(psgd.train.powersgd.error_feedback);
  EXPECT_DOUBLE_EQ(psgd.train.powersgd.min_compression_rate, 1.5);
  EXPECT_EQ(psgd.train.powersgd.random_seed, 7);
  EXPECT_THAT(ParseJobSpec("name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                           "train:\n  batch_size: 8\n  comm_hook: int8\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:6: train.comm_hook: must be none, fp16, bf16 or "
                                 "powersgd (got 'int8')")));
  EXPECT_THAT(ParseJobSpec("name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                           "train:\n  batch_size: 8\n  powersgd: {rank: 1}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.powersgd: is for comm_hook: powersgd only")));
  // PyTorch's ValueError: error feedback and warm start need two plain iterations.
  EXPECT_THAT(ParseJobSpec("name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                           "train:\n  batch_size: 8\n  comm_hook: powersgd\n"
                           "  powersgd: {start_iteration: 1}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.powersgd.start_iteration: must be > 1")));
  EXPECT_THAT(ParseJobSpec("name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                           "train:\n  batch_size: 8\n  comm_hook: powersgd\n"
                           "  powersgd: {rank: 0}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.powersgd.rank: must be > 0")));
}

TEST(JobSpecTest, IntraNodeCommDefaultsToAutoAndNamesBadValues) {
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec spec, ParseJobSpec("name: d\nmodel: {mlp: {}}\n"
                                                      "data: {synthetic: {}}\n"
                                                      "train: {batch_size: 4}\n"));
  EXPECT_EQ(spec.train.intra_node_comm, IntraNodeComm::kAuto);
  DDP_ASSERT_OK_AND_ASSIGN(spec, ParseJobSpec("name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                                              "train: {batch_size: 4, intra_node_comm: shm}\n"));
  EXPECT_EQ(spec.train.intra_node_comm, IntraNodeComm::kShm);
  EXPECT_THAT(ParseJobSpec("name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                           "train:\n  batch_size: 4\n  intra_node_comm: tcp\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:6: train.intra_node_comm: must be auto, shm or gloo "
                                 "(got 'tcp')")));
}

TEST(JobSpecTest, DeviceDefaultsToAutoAndRefusesWhatCannotRun) {
  constexpr char kBase[] = "name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n";
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec spec,
                           ParseJobSpec(std::string(kBase) + "train: {batch_size: 4}\n"));
  EXPECT_EQ(spec.train.device, Device::kAuto);
  // Gloo's CUDA path: the one way two ranks share a GPU.
  DDP_ASSERT_OK_AND_ASSIGN(spec, ParseJobSpec(std::string(kBase) +
                                              "backend: gloo\ntrain: {batch_size: 4, device: cuda}\n"));
  EXPECT_EQ(spec.train.device, Device::kCuda);
  EXPECT_EQ(spec.backend, Backend::kGloo);
  EXPECT_STREQ(DeviceName(spec.train.device), "cuda");
  EXPECT_THAT(ParseJobSpec(std::string(kBase) + "train:\n  batch_size: 4\n  device: tpu\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:6: train.device: must be auto, cpu or cuda (got 'tpu')")));
  EXPECT_THAT(ParseJobSpec(std::string(kBase) + "backend: nccl\ntrain:\n  batch_size: 4\n"
                                                "  device: cpu\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:7: train.device: cpu, but backend: nccl reduces GPU "
                                 "tensors only")));
  EXPECT_THAT(ParseJobSpec(std::string(kBase) + "train:\n  batch_size: 4\n  device: cuda\n"
                                                "  intra_node_comm: shm\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.intra_node_comm: shm reduces CPU tensors, but "
                                 "train.device is cuda")));
}

TEST(JobSpecTest, SchedulingFieldsParseAndNameBadValues) {
  constexpr char kBase[] = "name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\ntrain: {batch_size: 4}\n";
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec spec, ParseJobSpec(kBase));
  EXPECT_EQ(spec.priority, 0);
  EXPECT_TRUE(spec.node_selector.empty());
  EXPECT_EQ(spec.preemption, PreemptionPolicy::kAtCheckpoint);
  DDP_ASSERT_OK_AND_ASSIGN(
      spec, ParseJobSpec(std::string(kBase) +
                         "priority: -5\nnode_selector: {pool: team-a, slurm_job: 1234}\n"
                         "preemption: kill\n"));
  EXPECT_EQ(spec.priority, -5);
  EXPECT_EQ(spec.node_selector, (Labels{{"pool", "team-a"}, {"slurm_job", "1234"}}));
  EXPECT_EQ(spec.preemption, PreemptionPolicy::kKill);
  EXPECT_THAT(ParseJobSpec(std::string(kBase) + "priority: 1001\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:5: priority: must be -1000..1000 (got 1001)")));
  EXPECT_THAT(ParseJobSpec(std::string(kBase) + "node_selector:\n  pool: team a\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:6: node_selector.pool: a label value is 0-63")));
  EXPECT_THAT(ParseJobSpec(std::string(kBase) + "node_selector: [pool]\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("node_selector: expected a mapping of label: value")));
  EXPECT_THAT(ParseJobSpec(std::string(kBase) + "preemption: sometimes\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("preemption: must be at_checkpoint, kill or never (got "
                                 "'sometimes')")));
  EXPECT_EQ(spec.preemption_notice_s, 0);
  DDP_ASSERT_OK_AND_ASSIGN(
      spec, ParseJobSpec(std::string(kBase) + "preemption: kill\npreemption_notice_s: 45\n"));
  EXPECT_EQ(spec.preemption_notice_s, 45);
  EXPECT_THAT(ParseJobSpec(std::string(kBase) + "preemption_notice_s: 45\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:5: preemption_notice_s: only with `preemption: kill`")));
  EXPECT_THAT(ParseJobSpec(std::string(kBase) + "preemption: kill\npreemption_notice_s: -1\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("preemption_notice_s: must be 0 to 3600 seconds (got -1)")));
}

TEST(JobSpecTest, LabelsFromFlagsAreCheckedOnce) {
  DDP_ASSERT_OK_AND_ASSIGN(Labels labels, ParseLabelList({"pool=a", "gpu=h100", "empty="}));
  EXPECT_EQ(labels, (Labels{{"empty", ""}, {"gpu", "h100"}, {"pool", "a"}}));
  EXPECT_EQ(FormatLabels(labels), "empty=,gpu=h100,pool=a");
  EXPECT_THAT(ParseLabelList({"pool"}).status().message(), HasSubstr("expected KEY=VALUE"));
  EXPECT_THAT(ParseLabelList({"pool=a", "pool=b"}).status().message(), HasSubstr("given twice"));
  EXPECT_THAT(ParseLabelList({"-x=a"}).status().message(), HasSubstr("label key '-x'"));
  EXPECT_TRUE(SelectorMatches({{"pool", "a"}}, labels));
  EXPECT_FALSE(SelectorMatches({{"pool", "b"}}, labels));
  EXPECT_FALSE(SelectorMatches({{"zone", "1"}}, labels));
  EXPECT_TRUE(SelectorsDisjoint({{"pool", "a"}}, {{"pool", "b"}, {"gpu", "h100"}}));
  EXPECT_FALSE(SelectorsDisjoint({{"pool", "a"}}, {{"gpu", "h100"}}));
  EXPECT_FALSE(SelectorsDisjoint({}, {{"pool", "b"}}));
}

TEST(JobSpecTest, SharedMemoryIsRefusedForNccl) {
  EXPECT_THAT(ParseJobSpec("name: d\nbackend: nccl\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                           "train:\n  batch_size: 4\n  intra_node_comm: shm\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:7: train.intra_node_comm: shm reduces CPU tensors")));
}

TEST(JobSpecTest, CheckpointCadenceDefaultsToEveryEpochUnlessBothAreZero) {
  const std::string head =
      "name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\ntrain: {batch_size: 4}\n";
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec unset, ParseJobSpec(head + "checkpoint: {dir: c}\n"));
  EXPECT_EQ(unset.checkpoint.every_epochs, 1);
  DDP_ASSERT_OK_AND_ASSIGN(
      JobSpec zeros, ParseJobSpec(head + "checkpoint: {dir: c, every_epochs: 0, every_steps: 0}\n"));
  EXPECT_EQ(zeros.checkpoint.every_epochs, 0);
  EXPECT_EQ(zeros.checkpoint.every_steps, 0);
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec steps,
                           ParseJobSpec(head + "checkpoint: {dir: c, every_steps: 10}\n"));
  EXPECT_EQ(steps.checkpoint.every_epochs, 0);
  EXPECT_EQ(steps.checkpoint.every_steps, 10);
}

TEST(JobSpecTest, CheckpointKeepsTwoAndResumesUnlessToldOtherwise) {
  const std::string head =
      "name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\ntrain: {batch_size: 4}\n";
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec plain, ParseJobSpec(head + "checkpoint: {dir: c}\n"));
  EXPECT_EQ(plain.checkpoint.keep, 2);
  EXPECT_EQ(plain.checkpoint.resume, ResumePolicy::kYes);
  EXPECT_TRUE(plain.checkpoint.async) << "saves in the background unless told otherwise";
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec sync,
                           ParseJobSpec(head + "checkpoint: {dir: c, async: false}\n"));
  EXPECT_FALSE(sync.checkpoint.async);
  EXPECT_THAT(ParseJobSpec(head + "checkpoint: {dir: c, async: later}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("checkpoint.async")));
  DDP_ASSERT_OK_AND_ASSIGN(
      JobSpec forced, ParseJobSpec(head + "checkpoint: {dir: c, keep: 5, resume: force}\n"));
  EXPECT_EQ(forced.checkpoint.keep, 5);
  EXPECT_EQ(forced.checkpoint.resume, ResumePolicy::kForce);
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec off,
                           ParseJobSpec(head + "checkpoint: {dir: c, resume: false}\n"));
  EXPECT_EQ(off.checkpoint.resume, ResumePolicy::kNo);
  EXPECT_THAT(ParseJobSpec(head + "checkpoint: {dir: c, keep: 0, resume: maybe}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("job.yaml:5: checkpoint.keep: must be > 0 (got 0)"),
                             HasSubstr("job.yaml:5: checkpoint.resume: expected true, false or "
                                       "force, got 'maybe'"))));
}

TEST(JobSpecTest, UnknownFieldSuggestsTheNearestName) {
  auto spec = ParseJobSpec("name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                           "train: {batch_size: 4, epoch: 3}\n");
  EXPECT_THAT(spec, StatusIs(absl::StatusCode::kInvalidArgument,
                             HasSubstr("job.yaml:4: train.epoch: unknown field (did you mean "
                                       "epochs?)")));
}

TEST(JobSpecTest, ADocumentStartMarkerAloneIsOneDocument) {
  // `---` opening the file (and `...` closing it) is common and still one job.
  auto spec = ParseJobSpec(absl::StrCat("---\n", kDesignExample, "...\n"), "job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name, "cancer-ddp");
}

TEST(JobSpecTest, ASecondDocumentIsRefusedAtTheLineWhereItBegins) {
  const std::string text = absl::StrCat(kDesignExample, "---\nname: other\ncommand: [/bin/true]\n");
  const int second_line = 1 + static_cast<int>(std::count(kDesignExample,
                                                         kDesignExample + sizeof(kDesignExample) - 1,
                                                         '\n'));
  EXPECT_THAT(ParseJobSpec(text, "job.yaml").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(absl::StrCat("job.yaml:", second_line,
                                              ": a second YAML document begins here"))));
  // Even an empty second document: the author meant something by it.
  EXPECT_THAT(ParseJobSpec(absl::StrCat(kDesignExample, "---\n"), "job.yaml").status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("second YAML document")));
}

TEST(JobSpecTest, AComplexKeySaysWhatWasFound) {
  EXPECT_THAT(ParseJobSpec("name: x\ntrain:\n  ? [a, b]\n  : c\n", "job.yaml").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:3: train: a key must be a field name, found a list "
                                 "[a, b]")));
  EXPECT_THAT(ParseJobSpec("name: x\ncommand: [a]\nenv:\n  ? {k: v}\n  : 1\n", "job.yaml").status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("env: a key must be a field name, found a mapping {k: v}")));
}

TEST(JobSpecTest, MalformedYamlReportsTheLine) {
  auto spec = ParseJobSpec("name: d\ntrain: {batch_size: 4\nmodel: x\n");
  EXPECT_THAT(spec, StatusIs(absl::StatusCode::kInvalidArgument,
                             AllOf(HasSubstr("job.yaml:"), HasSubstr("not valid YAML"))));
}

TEST(JobSpecTest, ReportsEveryProblemAtOnce) {
  auto spec = ParseJobSpec(R"(name: d
nodes: "4:1"
model: {mlp: {hidden: [8, -1]}}
data: {csv: {path: x.csv}, validation: {fraction: 1.5}}
train: {batch_size: 4, loss: hinge}
)");
  ASSERT_FALSE(spec.ok());
  const std::string msg(spec.status().message());
  EXPECT_THAT(msg, HasSubstr("job.yaml:2: nodes: need 1 <= min <= max (got 4:1)"));
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: model.mlp.hidden[1]: must be > 0 (got -1)"));
  EXPECT_THAT(msg, HasSubstr("job.yaml:4: data.validation.fraction: must be in [0, 1)"));
  EXPECT_THAT(msg, HasSubstr("job.yaml:5: train.loss: must be cross_entropy, mse or"));
}

TEST(JobSpecTest, ParsesElasticNodesAndAutoProcs) {
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec spec, ParseJobSpec(R"(
name: e
nodes: "1:4"
nproc_per_node: auto
model: {mlp: {}}
data: {synthetic: {}}
train: {batch_size: 4}
)"));
  EXPECT_EQ(spec.nodes.min, 1);
  EXPECT_EQ(spec.nodes.max, 4);
  EXPECT_TRUE(spec.nodes.elastic());
  EXPECT_EQ(spec.nproc_per_node, 0);
  EXPECT_EQ(NodeRangeString(spec.nodes), "1:4");
}

TEST(JobSpecTest, RequiresExactlyOneModel) {
  EXPECT_THAT(ParseJobSpec("name: d\nmodel: {mlp: {}, cnn: {}}\ndata: {synthetic: {}}\n"
                           "train: {batch_size: 4}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model: give only one of mlp and cnn")));
  EXPECT_THAT(ParseJobSpec("name: d\nmodel: {}\ndata: {synthetic: {}}\ntrain: {batch_size: 4}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model: one of mlp, cnn, torchscript, gpt is required")));
}

TEST(JobSpecTest, MissingRequiredSectionsAreNamed) {
  auto spec = ParseJobSpec("name: d\nmodel: {mlp: {}}\n");
  ASSERT_FALSE(spec.ok());
  const std::string msg(spec.status().message());
  EXPECT_THAT(msg, HasSubstr("data: is required"));
  EXPECT_THAT(msg, HasSubstr("train: is required"));
}

TEST(JobSpecTest, AJobThatRunsNothingSaysWhatToGive) {
  EXPECT_THAT(ParseJobSpec("name: d\nnodes: 2\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("job.yaml:1: command: the job runs nothing"),
                             HasSubstr("command: [program, args...]"),
                             HasSubstr("model, data and train"))));
}

TEST(JobSpecTest, ParsesACommandJob) {
  DDP_ASSERT_OK_AND_ASSIGN(
      JobSpec spec, ParseJobSpec("name: script\nnodes: 1:3\nnproc_per_node: auto\n"
                                 "max_restarts: 2\nenv: {NCCL_DEBUG: WARN}\n"
                                 "command: [python3, train.py, --epochs, 10, --lr, 1e-3]\n"
                                 "stall_timeout_s: 60\nrdzv: {last_call_s: 2}\n"));
  EXPECT_TRUE(spec.is_command());
  EXPECT_EQ(spec.command, (std::vector<std::string>{"python3", "train.py", "--epochs", "10",
                                                    "--lr", "1e-3"}));
  EXPECT_EQ(spec.nodes.min, 1);
  EXPECT_EQ(spec.nodes.max, 3);
  EXPECT_EQ(spec.nproc_per_node, 0);
  EXPECT_EQ(spec.max_restarts, 2);
  EXPECT_EQ(spec.env.at("NCCL_DEBUG"), "WARN");
  EXPECT_DOUBLE_EQ(spec.train.stall_timeout_s, 60);
  EXPECT_DOUBLE_EQ(spec.train.collective_timeout_s, kCommandCollectiveTimeoutS);
  EXPECT_DOUBLE_EQ(spec.rdzv.last_call_s, 2);
}

TEST(JobSpecTest, ACommandAndTheBuiltInTrainerTogetherAreRefusedAtTheirLines) {
  auto spec = ParseJobSpec("name: d\ncommand: [python3, t.py]\nmodel: {mlp: {}}\n"
                           "data: {synthetic: {}}\ntrain: {batch_size: 4}\n");
  ASSERT_FALSE(spec.ok());
  const std::string msg(spec.status().message());
  EXPECT_THAT(msg, HasSubstr("job.yaml:3: model: a job runs either its own program (command) "
                             "or the built-in trainer"));
  EXPECT_THAT(msg, HasSubstr("job.yaml:4: data:"));
  EXPECT_THAT(msg, HasSubstr("job.yaml:5: train:"));
  EXPECT_THAT(ParseJobSpec("name: d\ncommand: [a]\ncheckpoint: {dir: c}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("a program writes its own checkpoints")));
}

TEST(JobSpecTest, BadCommandsNameTheEntry) {
  EXPECT_THAT(ParseJobSpec("name: d\ncommand: []\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:2: command: must not be empty")));
  EXPECT_THAT(ParseJobSpec("name: d\ncommand: python3 train.py\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("command: expected a list such as [python3, train.py")));
  EXPECT_THAT(ParseJobSpec("name: d\ncommand: [python3, {a: 1}]\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("command[1]: expected a string")));
  EXPECT_THAT(ParseJobSpec("name: d\ncommand: ['', x]\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("command[0]: the program must not be empty")));
  EXPECT_THAT(ParseJobSpec("name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                           "train: {batch_size: 4}\nstall_timeout_s: 5\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stall_timeout_s: is a command job's field")));
}

TEST(JobSpecTest, RecoveryAndNoticeFieldsAreCheckedAndNamed) {
  auto spec = ParseJobSpec(
      "name: d\nmax_recoveries: 3\nrecovery_timeout_s: 20\nstop_grace_s: 4\n"
      "notice_signal: SIGUSR1\ncommand: [a]\n");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->max_recoveries, 3);
  EXPECT_EQ(spec->recovery_timeout_s, 20);
  EXPECT_EQ(spec->stop_grace_s, 4);
  EXPECT_EQ(spec->notice_signal, SIGUSR1);
  auto defaults = ParseJobSpec("name: d\ncommand: [a]\n");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->max_recoveries, 0);
  EXPECT_EQ(defaults->recovery_timeout_s, 60);
  EXPECT_EQ(defaults->notice_signal, 0);
  EXPECT_THAT(ParseJobSpec("name: d\nmax_recoveries: -1\ncommand: [a]\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_recoveries: must be >= 0 (got -1)")));
  EXPECT_THAT(ParseJobSpec("name: d\nmax_recoveries: 1001\ncommand: [a]\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("max_recoveries: must be <= 1000")));
  EXPECT_THAT(ParseJobSpec("name: d\nrecovery_timeout_s: 0\ncommand: [a]\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("recovery_timeout_s: must be > 0 (got 0)")));
  EXPECT_THAT(ParseJobSpec("name: d\nstop_grace_s: -2\ncommand: [a]\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("stop_grace_s: must be >= 0 (got -2)")));
  EXPECT_THAT(ParseJobSpec("name: d\nnotice_signal: SIGKILL\ncommand: [a]\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("notice_signal: must be SIGUSR1, SIGUSR2, SIGINT, SIGHUP or "
                                 "SIGTERM (got 'SIGKILL')")));
  EXPECT_THAT(ParseJobSpec("name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                           "train: {batch_size: 4}\nnotice_signal: SIGUSR1\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("notice_signal: is a command job's field")));
}

TEST(JobSpecTest, TorchElasticVariablesCannotBeOverriddenEither) {
  for (const char* name : {"GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME",
                           "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
                           "TORCHELASTIC_USE_AGENT_STORE", "DDP_JOB_ID"}) {
    EXPECT_THAT(ParseJobSpec(absl::StrCat("name: d\nenv: {", name, ": x}\ncommand: [a]\n")),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         HasSubstr(absl::StrCat("env.", name, ": is set by ddp"))))
        << name;
  }
  // OMP_NUM_THREADS is the job's to choose (torchrun's default is only a default).
  EXPECT_TRUE(ParseJobSpec("name: d\nenv: {OMP_NUM_THREADS: '4'}\ncommand: [a]\n").ok());
}

TEST(JobSpecTest, CnnNeedsImageData) {
  EXPECT_THAT(ParseJobSpec("name: d\nmodel: {cnn: {}}\ndata: {synthetic: {}}\n"
                           "train: {batch_size: 4}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.cnn: needs image data (data.idx)")));
}

TEST(JobSpecTest, CollectiveTimeoutMustExceedRendezvousTimeout) {
  EXPECT_THAT(ParseJobSpec("name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                           "rdzv: {timeout_s: 60}\ntrain: {batch_size: 4, "
                           "collective_timeout_s: 30}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.collective_timeout_s: must be greater than "
                                 "rdzv.timeout_s")));
}

TEST(JobSpecTest, StallTimeoutMustBeBelowTheCollectiveTimeout) {
  const std::string base = "name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n";
  auto ok = ParseJobSpec(base + "train: {batch_size: 4, stall_timeout_s: 20}\n");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->train.stall_timeout_s, 20);
  EXPECT_EQ(ParseJobSpec(base + "train: {batch_size: 4}\n")->train.stall_timeout_s, 0)
      << "0: learned by the coordinator";
  EXPECT_THAT(ParseJobSpec(base + "train: {batch_size: 4, stall_timeout_s: 300}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.stall_timeout_s: must be less than "
                                 "train.collective_timeout_s (300s)")));
  EXPECT_THAT(ParseJobSpec(base + "train: {batch_size: 4, stall_timeout_s: -1}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.stall_timeout_s: must be >= 0 (got -1)")));
}

TEST(JobSpecTest, TorchrunVariablesCannotBeOverridden) {
  EXPECT_THAT(ParseJobSpec("name: d\nenv: {RANK: '3', OMP_NUM_THREADS: '1'}\n"
                           "model: {mlp: {}}\ndata: {synthetic: {}}\ntrain: {batch_size: 4}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("env.RANK: is set by ddp and cannot be overridden")));
}

TEST(JobSpecTest, ParsesIdxWithSeparateValidationSet) {
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec spec, ParseJobSpec(R"(
name: fmnist
model: {cnn: {channels: [8, 16], kernel: 3, hidden: 64}}
data:
  idx: {images: a.gz, labels: b.gz}
  validation: {idx: {images: c.gz, labels: d.gz}}
train: {batch_size: 32, optimizer: {name: sgd, lr: 0.1, momentum: 0.9, nesterov: true}}
)"));
  EXPECT_EQ(spec.model.cnn.channels, (std::vector<int64_t>{8, 16}));
  EXPECT_EQ(spec.model.cnn.kernel, 3);
  EXPECT_TRUE(spec.data.validation.has_idx);
  EXPECT_EQ(spec.data.validation.idx.labels, "d.gz");
  EXPECT_TRUE(spec.train.optimizer.nesterov);
  EXPECT_DOUBLE_EQ(spec.train.optimizer.momentum, 0.9);
}

TEST(JobSpecTest, SgdNeedsAnExplicitLearningRate) {
  EXPECT_THAT(ParseJobSpec("name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                           "train: {batch_size: 4, optimizer: {name: sgd}}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.optimizer.lr: is required for sgd")));
}

TEST(JobSpecTest, TypeErrorsShowTheValue) {
  EXPECT_THAT(ParseJobSpec("name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                           "train: {batch_size: eight}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.batch_size: expected an integer, got 'eight'")));
}

TEST(JobSpecTest, MissingFileIsNotFound) {
  EXPECT_THAT(LoadJobSpecFile("/nonexistent/job.yaml"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/job.yaml")));
}

// train.optimizer.zero_redundancy (ZeRO stage 1, decision 163): off by default, for
// every optimizer the trainer has, refused with live recovery, a boolean.
TEST(JobSpecTest, ZeroRedundancyIsABooleanOfEveryOptimizer) {
  const std::string head = "name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n";
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec plain, ParseJobSpec(head + "train: {batch_size: 4}\n"));
  EXPECT_FALSE(plain.train.optimizer.zero_redundancy);
  for (const std::string optimizer :
       {"{name: sgd, lr: 0.1, momentum: 0.9, zero_redundancy: true}",
        "{name: adam, zero_redundancy: true}", "{name: adamw, zero_redundancy: true}"}) {
    SCOPED_TRACE(optimizer);
    DDP_ASSERT_OK_AND_ASSIGN(
        JobSpec spec,
        ParseJobSpec(head + "max_recoveries: 0\ntrain: {batch_size: 4, optimizer: " + optimizer +
                     "}\n"));
    EXPECT_TRUE(spec.train.optimizer.zero_redundancy);
  }
  EXPECT_THAT(ParseJobSpec(head +
                           "train: {batch_size: 4, optimizer: {zero_redundancy: yes please}}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.optimizer.zero_redundancy: expected true or false")));
}

TEST(JobSpecTest, ZeroRedundancyWithLiveRecoveryIsRefusedNamingWhatToDo) {
  auto spec = ParseJobSpec(
      "name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\nmax_recoveries: 2\n"
      "train:\n  batch_size: 4\n  optimizer: {name: adam, zero_redundancy: true}\n");
  EXPECT_THAT(spec, StatusIs(absl::StatusCode::kInvalidArgument,
                             HasSubstr(":7: train.optimizer.zero_redundancy: cannot be recovered "
                                       "live (max_recoveries: 2)")));
  EXPECT_THAT(spec, StatusIs(absl::StatusCode::kInvalidArgument,
                             HasSubstr("Set max_recoveries: 0")));
  // Without ZeRO the same job is fine.
  EXPECT_TRUE(ParseJobSpec("name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n"
                           "max_recoveries: 2\ntrain:\n  batch_size: 4\n"
                           "  optimizer: {name: adam}\n")
                  .ok());
}

TEST(JobSpecTest, CudaGraphIsAutoTrueOrFalse) {
  constexpr char kBase[] = "name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n";
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec spec,
                           ParseJobSpec(std::string(kBase) + "train: {batch_size: 4}\n"));
  EXPECT_EQ(spec.train.cuda_graph, CudaGraphMode::kAuto);
  for (const auto& [text, mode] : std::vector<std::pair<std::string, CudaGraphMode>>{
           {"auto", CudaGraphMode::kAuto},
           {"true", CudaGraphMode::kOn},
           {"false", CudaGraphMode::kOff}}) {
    DDP_ASSERT_OK_AND_ASSIGN(
        spec, ParseJobSpec(std::string(kBase) + "train: {batch_size: 4, cuda_graph: " + text + "}\n"));
    EXPECT_EQ(spec.train.cuda_graph, mode) << text;
    EXPECT_EQ(CudaGraphModeName(mode), text);
  }
  EXPECT_THAT(ParseJobSpec(std::string(kBase) + "train:\n  batch_size: 4\n  cuda_graph: always\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:6: train.cuda_graph: expected true, false or auto, "
                                 "got 'always'")));
}

TEST(JobSpecTest, CudaGraphTrueIsRefusedForWhatCannotBeCaptured) {
  // Each of these keeps the step out of a graph; with auto the job trains eagerly, with
  // true it is refused at submission, naming the field that rules it out.
  constexpr char kBase[] = "name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train: {batch_size: 4, device: cpu, cuda_graph: true}\n",
       "train.cuda_graph: true, but train.device is cpu"},
      {"backend: gloo\ntrain: {batch_size: 4, device: cuda, cuda_graph: true}\n",
       "train.cuda_graph: true, but backend: gloo runs its collectives on the host"},
      {"train: {batch_size: 4, comm_hook: fp16, cuda_graph: true}\n",
       "train.cuda_graph: true, but train.comm_hook"},
      {"train: {batch_size: 4, optimizer: {name: adam, zero_redundancy: true}, "
       "cuda_graph: true}\n",
       "train.cuda_graph: true, but train.optimizer.zero_redundancy"},
      {"train: {batch_size: 4, cuda_graph: true}\nmetrics: {trace_buckets: true}\n",
       "train.cuda_graph: true, but metrics.trace_buckets"},
      {"train: {batch_size: 4, optimizer: {name: adam, fused: false}, cuda_graph: true}\n",
       "train.cuda_graph: true, but train.optimizer.fused: false"},
  };
  for (const auto& [text, error] : cases) {
    EXPECT_THAT(ParseJobSpec(std::string(kBase) + text),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(error)))
        << text;
    // auto takes the same job, and trains it eagerly.
    std::string automatic = text;
    automatic.replace(automatic.find("cuda_graph: true"), 16, "cuda_graph: auto");
    EXPECT_TRUE(ParseJobSpec(std::string(kBase) + automatic).ok()) << automatic;
  }
  // And a job that can be captured (on a GPU node) is accepted with true.
  EXPECT_TRUE(ParseJobSpec(std::string(kBase) + "train: {batch_size: 4, cuda_graph: true}\n").ok());
}

// model.gpt and data.tokens (docs/job-spec.md): GPT-2 124M by default, a second token
// file for validation, and the rules that tie the two together.
constexpr char kGptJob[] = R"(name: gpt
model: {gpt: {}}
data: {tokens: {path: train.bin}}
train: {batch_size: 4}
)";

TEST(JobSpecTest, GptDefaultsToGpt2SmallAndTokensToUint16) {
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec spec, ParseJobSpec(kGptJob));
  EXPECT_EQ(spec.model.kind, ModelSpec::Kind::kGpt);
  const GptSpec& g = spec.model.gpt;
  EXPECT_EQ(g.layers, 12);
  EXPECT_EQ(g.heads, 12);
  EXPECT_EQ(g.dim, 768);
  EXPECT_EQ(g.seq_len, 1024);
  EXPECT_EQ(g.vocab, 50304);
  EXPECT_EQ(g.dropout, 0.0);
  EXPECT_TRUE(g.tie_weights);
  // nanoGPT's "123.69M" for GPT-2 at vocab 50304, plus the position embedding it leaves
  // out of its count (1024 x 768).
  EXPECT_EQ(GptParameterCount(g), 123689472 + 1024 * 768);
  EXPECT_EQ(spec.data.kind, DataSpec::Kind::kTokens);
  EXPECT_EQ(spec.data.tokens.path, "train.bin");
  EXPECT_EQ(spec.data.tokens.dtype, TokenDtype::kUint16);
  EXPECT_FALSE(spec.data.validation.has_tokens);
  // `gpt:` with nothing after it is the default model too.
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec bare, ParseJobSpec("name: g\nmodel:\n  gpt:\n"
                                                      "data: {tokens: {path: t.bin}}\n"
                                                      "train: {batch_size: 1}\n"));
  EXPECT_EQ(bare.model.gpt.dim, 768);
}

TEST(JobSpecTest, GptFieldsAndAValidationFileParse) {
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec spec, ParseJobSpec(R"(name: gpt
model:
  gpt: {layers: 2, heads: 2, dim: 32, seq_len: 16, vocab: 256, dropout: 0.1, tie_weights: false}
data:
  tokens: {path: train.bin, dtype: uint32}
  validation: {tokens: {path: val.bin}}
train: {batch_size: 4}
)"));
  const GptSpec& g = spec.model.gpt;
  EXPECT_EQ(g.layers, 2);
  EXPECT_EQ(g.heads, 2);
  EXPECT_EQ(g.dim, 32);
  EXPECT_EQ(g.seq_len, 16);
  EXPECT_EQ(g.vocab, 256);
  EXPECT_DOUBLE_EQ(g.dropout, 0.1);
  EXPECT_FALSE(g.tie_weights);
  // Untied: the head's 256 x 32 on top of the tied model's count.
  GptSpec tied = g;
  tied.tie_weights = true;
  EXPECT_EQ(GptParameterCount(g) - GptParameterCount(tied), 256 * 32);
  EXPECT_EQ(spec.data.tokens.dtype, TokenDtype::kUint32);
  ASSERT_TRUE(spec.data.validation.has_tokens);
  EXPECT_EQ(spec.data.validation.tokens.path, "val.bin");
  EXPECT_EQ(spec.data.validation.tokens.dtype, TokenDtype::kUint32)
      << "the validation file's dtype defaults to the training file's";
  DDP_ASSERT_OK_AND_ASSIGN(
      JobSpec mixed,
      ParseJobSpec("name: g\nmodel: {gpt: {}}\ndata:\n  tokens: {path: a.bin, dtype: uint32}\n"
                   "  validation: {tokens: {path: b.bin, dtype: uint16}}\n"
                   "train: {batch_size: 1}\n"));
  EXPECT_EQ(mixed.data.validation.tokens.dtype, TokenDtype::kUint16);
}

TEST(JobSpecTest, GptShapeErrorsNameTheFieldAndLine) {
  const std::string tail = "data: {tokens: {path: t.bin}}\ntrain: {batch_size: 4}\n";
  auto parse = [&](const std::string& gpt) {
    return ParseJobSpec("name: g\nmodel:\n  gpt: " + gpt + "\n" + tail);
  };
  EXPECT_THAT(parse("{dim: 100, heads: 3}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:3: model.gpt.dim: must be a multiple of "
                                 "model.gpt.heads (got dim 100, heads 3)")));
  EXPECT_THAT(parse("{heads: 5}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.gpt.dim: must be a multiple of model.gpt.heads (got "
                                 "dim 768, heads 5)")));
  EXPECT_THAT(parse("{dropout: 1}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.gpt.dropout: must be in [0, 1) (got 1)")));
  EXPECT_THAT(parse("{dropout: -0.1}"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model.gpt.dropout")));
  EXPECT_THAT(parse("{layers: 0}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.gpt.layers: must be 1..1024 (got 0)")));
  EXPECT_THAT(parse("{vocab: 1}"), StatusIs(absl::StatusCode::kInvalidArgument,
                                            HasSubstr("model.gpt.vocab: must be 2..16777216")));
  EXPECT_THAT(parse("{seq_len: 9223372036854775807}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.gpt.seq_len: must be 1..1048576")));
  EXPECT_THAT(parse("{dim: 65537}"), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("model.gpt.dim: must be 1..65536")));
  EXPECT_THAT(parse("{heads: two}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.gpt.heads: expected an integer, got 'two'")));
  EXPECT_THAT(parse("{tie_weights: maybe}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.gpt.tie_weights: expected true or false")));
  EXPECT_THAT(parse("{depth: 2}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("model.gpt.depth: unknown field")));
  // Every field within its bound, the whole too large to describe: 1024 blocks of 65536
  // channels are 5.3e13 parameters.
  EXPECT_THAT(parse("{layers: 1024, dim: 65536, heads: 64}"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("job.yaml:3: model.gpt: has 52780794511360 parameters"),
                             HasSubstr("more than the 1099511627776 (2^40) a job may "
                                       "describe"))));
}

TEST(JobSpecTest, TokenFileErrorsNameTheField) {
  const std::string head = "name: g\nmodel: {gpt: {}}\n";
  const std::string tail = "train: {batch_size: 4}\n";
  EXPECT_THAT(ParseJobSpec(head + "data: {tokens: {path: t.bin, dtype: int8}}\n" + tail),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:3: data.tokens.dtype: must be uint16 or uint32 "
                                 "(got 'int8')")));
  EXPECT_THAT(ParseJobSpec(head + "data: {tokens: {dtype: uint16}}\n" + tail),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.tokens.path: is required")));
  EXPECT_THAT(ParseJobSpec(head + "data:\n  tokens: {path: t.bin}\n"
                                  "  validation: {tokens: {path: v.bin, dtype: u16}}\n" + tail),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:5: data.validation.tokens.dtype: must be uint16 or "
                                 "uint32")));
}

TEST(JobSpecTest, GptAndTokenDataGoTogether) {
  EXPECT_THAT(ParseJobSpec("name: g\nmodel: {gpt: {}}\ndata: {synthetic: {}}\n"
                           "train: {batch_size: 4}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:2: model.gpt: needs token data (data.tokens")));
  EXPECT_THAT(ParseJobSpec("name: g\nmodel: {mlp: {}}\ndata: {tokens: {path: t.bin}}\n"
                           "train: {batch_size: 4}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:3: data.tokens: is a token stream for model.gpt")));
  EXPECT_THAT(ParseJobSpec("name: g\nmodel: {gpt: {}}\ndata: {tokens: {path: t.bin}}\n"
                           "train: {batch_size: 4, loss: mse}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:4: train.loss: model.gpt trains with cross_entropy "
                                 "over the next token (got mse)")));
}

TEST(JobSpecTest, TokenValidationIsASecondFileNotAFraction) {
  EXPECT_THAT(ParseJobSpec("name: g\nmodel: {gpt: {}}\ndata:\n  tokens: {path: t.bin}\n"
                           "  validation: {fraction: 0.1}\ntrain: {batch_size: 4}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("job.yaml:5: data.validation.fraction: is not for "
                                       "data.tokens"),
                             HasSubstr("data.validation: {tokens: {path: val.bin}}"))));
  EXPECT_THAT(ParseJobSpec("name: g\nmodel: {gpt: {}}\ndata:\n  tokens: {path: t.bin}\n"
                           "  validation: {fraction: 0.1, tokens: {path: v.bin}}\n"
                           "train: {batch_size: 4}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("data.validation: give only one of fraction and tokens")));
  EXPECT_THAT(ParseJobSpec("name: g\nmodel: {mlp: {}}\ndata:\n  synthetic: {}\n"
                           "  validation: {tokens: {path: v.bin}}\ntrain: {batch_size: 4}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("job.yaml:5: data.validation.tokens: needs data.tokens "
                                 "training data")));
}

// train.optimizer.fused (decision 170): auto by default; true, false or auto.
TEST(JobSpecTest, FusedIsAutoTrueOrFalse) {
  const std::string head = "name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n";
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec plain, ParseJobSpec(head + "train: {batch_size: 4}\n"));
  EXPECT_EQ(plain.train.optimizer.fused, FusedPolicy::kAuto);
  for (const auto& [text, want] : std::vector<std::pair<std::string, FusedPolicy>>{
           {"auto", FusedPolicy::kAuto}, {"true", FusedPolicy::kTrue},
           {"false", FusedPolicy::kFalse}}) {
    SCOPED_TRACE(text);
    DDP_ASSERT_OK_AND_ASSIGN(
        JobSpec spec, ParseJobSpec(head + "train: {batch_size: 4, optimizer: {name: adamw, "
                                          "fused: " + text + "}}\n"));
    EXPECT_EQ(spec.train.optimizer.fused, want);
  }
  EXPECT_THAT(ParseJobSpec(head + "train: {batch_size: 4, optimizer: {name: sgd, lr: 0.1, "
                                  "fused: maybe}}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr(":4: train.optimizer.fused: expected true, false or auto, "
                                 "got 'maybe'")));
}

// train.optimizer.weight_decay_params (decision 172): all by default, or matrices.
TEST(JobSpecTest, WeightDecayParamsIsAllOrMatrices) {
  const std::string head = "name: d\nmodel: {mlp: {}}\ndata: {synthetic: {}}\n";
  DDP_ASSERT_OK_AND_ASSIGN(JobSpec plain, ParseJobSpec(head + "train: {batch_size: 4}\n"));
  EXPECT_EQ(plain.train.optimizer.weight_decay_params, WeightDecayParams::kAll);
  for (const std::string name : {"sgd, lr: 0.1", "adam", "adamw"}) {
    DDP_ASSERT_OK_AND_ASSIGN(
        JobSpec spec,
        ParseJobSpec(head + "train: {batch_size: 4, optimizer: {name: " + name +
                     ", weight_decay: 0.1, weight_decay_params: matrices}}\n"));
    EXPECT_EQ(spec.train.optimizer.weight_decay_params, WeightDecayParams::kMatrices) << name;
  }
  EXPECT_THAT(ParseJobSpec(head + "train: {batch_size: 4, optimizer: {name: adamw, "
                                  "weight_decay_params: biases}}\n"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("train.optimizer.weight_decay_params: must be all or matrices "
                                 "(parameters of 2 or more dimensions decay, biases and norm "
                                 "weights do not) (got 'biases')")));
}

}  // namespace
}  // namespace ddp

