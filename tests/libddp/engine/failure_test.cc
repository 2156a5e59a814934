// The trainer's failure classes: which failures end a job, which are retried, and
// which blame the node. No LibTorch: the allocator messages are LibTorch's own text.
#include "libddp/engine/failure.h"

#include "common/contract/exit_codes.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace ddp {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

TEST(FailureTest, SpecAndDataErrorsArePermanentRuntimeErrorsRetryable) {
  EXPECT_EQ(ClassifyFailure(absl::InvalidArgumentError("train.batch_size")),
            FailureKind::kPermanent);
  EXPECT_EQ(ClassifyFailure(absl::NotFoundError("data.csv.path")), FailureKind::kPermanent);
  EXPECT_EQ(ClassifyFailure(absl::FailedPreconditionError("x")), FailureKind::kPermanent);
  EXPECT_EQ(ClassifyFailure(absl::UnavailableError("peer died")), FailureKind::kRetryable);
  EXPECT_EQ(ClassifyFailure(absl::InternalError("c10d")), FailureKind::kRetryable);
  EXPECT_EQ(ClassifyFailure(absl::ResourceExhaustedError("oom")), FailureKind::kRetryable);
}

TEST(FailureTest, AMarkOverridesTheCode) {
  // ChooseDevice's FAILED_PRECONDITION for a missing GPU is this node's fault.
  const absl::Status no_gpu = AsNodeFault(absl::FailedPreconditionError("no GPU"));
  EXPECT_EQ(ClassifyFailure(no_gpu), FailureKind::kNodeFault);
  EXPECT_EQ(no_gpu.message(), "no GPU");
  EXPECT_EQ(ClassifyFailure(AsPermanent(absl::ResourceExhaustedError("too big"))),
            FailureKind::kPermanent);
  EXPECT_EQ(ExitCodeFor(FailureKind::kPermanent), kExitPermanent);
  EXPECT_EQ(ExitCodeFor(FailureKind::kNodeFault), kExitNodeFault);
  EXPECT_EQ(ExitCodeFor(FailureKind::kRetryable), kExitRetryable);
  EXPECT_TRUE(IsRetryableExit(kExitNodeFault));
}

TEST(FailureTest, AnAllocationLargerThanTheMachineIsPermanent) {
  const std::string what =
      "[enforce fail at alloc_cpu.cpp:75] err == 0. DefaultCPUAllocator: can't allocate "
      "memory: you tried to allocate 120000000000000 bytes. Error code 12 (Cannot allocate "
      "memory)\nframe #0: ...";
  const absl::Status st = AllocationFailure(what, 16 * kGiB);
  EXPECT_EQ(ClassifyFailure(st), FailureKind::kPermanent);
  EXPECT_THAT(st.message(), HasSubstr("exceeds this machine's whole memory (16384 MiB)"));
  EXPECT_THAT(st.message(), ::testing::Not(HasSubstr("frame #0")));
}

TEST(FailureTest, AnAllocationThatWouldFitOnAnIdleMachineIsRetryable) {
  const std::string what =
      "DefaultCPUAllocator: not enough memory: you tried to allocate 8589934592 bytes.";
  EXPECT_EQ(ClassifyFailure(AllocationFailure(what, 16 * kGiB)), FailureKind::kRetryable);
  EXPECT_EQ(ClassifyFailure(AllocationFailure("some other failure", 16 * kGiB)),
            FailureKind::kRetryable);
}

TEST(FailureTest, ReadsBothCudaAllocatorMessages) {
  const std::string v1 =
      "CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 15.78 GiB total capacity; "
      "1.02 GiB already allocated; 14.1 GiB free)";
  const std::string v2 =
      "CUDA out of memory. Tried to allocate 90.00 GiB. GPU 0 has a total capacity of "
      "79.15 GiB of which 78.2 GiB is free.";
  const std::string fits =
      "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 15.78 GiB total capacity; "
      "14.9 GiB already allocated)";
  EXPECT_EQ(ClassifyFailure(AllocationFailure(v1, 0)), FailureKind::kPermanent);
  EXPECT_THAT(AllocationFailure(v1, 0).message(),
              HasSubstr("exceeds the GPU's whole memory (16159 MiB)"));
  EXPECT_EQ(ClassifyFailure(AllocationFailure(v2, 0)), FailureKind::kPermanent);
  EXPECT_EQ(ClassifyFailure(AllocationFailure(fits, 0)), FailureKind::kRetryable);
}

}  // namespace
}  // namespace ddp
