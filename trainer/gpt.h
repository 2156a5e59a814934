// model.gpt: libddp's GPT-2 (<ddp/gpt.h>: nanoGPT's architecture, parameter names and
// initial weights, draw for draw; decision 168) behind the trainer's Model interface.
#ifndef DDP_TRAINER_GPT_H_
#define DDP_TRAINER_GPT_H_

#include <memory>

#include "common/jobspec/job_spec.h"
#include "trainer/model.h"

namespace ddp {

// Builds `spec`'s GPT on the CPU from the global generator's current state (the
// trainer seeds it with train.seed first).
std::unique_ptr<Model> BuildGpt(const GptSpec& spec);

}  // namespace ddp

#endif  // DDP_TRAINER_GPT_H_
