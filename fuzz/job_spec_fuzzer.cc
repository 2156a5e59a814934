// libFuzzer target: job.yaml bytes -> the parser and validator (ddpctl, the
// coordinator and every trainer run them on untrusted text). Any input must end in a
// JobSpec or an error status: no crash, leak, hang or undefined behaviour.
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/jobspec/job_spec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto spec = ddp::ParseJobSpec(text, "fuzz.yaml");
  if (spec.ok()) {
    // What the trainer and coordinator compute from a valid spec must not overflow.
    volatile int64_t steps = spec->train.epochs * spec->train.grad_accum_steps;
    volatile int64_t seed = spec->train.seed + spec->train.epochs;
    (void)steps;
    (void)seed;
  }
  return 0;
}
