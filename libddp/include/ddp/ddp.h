// libddp: distributed data-parallel training for LibTorch programs.
//
//   #include <ddp/ddp.h>
//   find_package(ddp REQUIRED) ... target_link_libraries(app PRIVATE ddp::ddp)
//
// docs/library.md walks a complete program and maps each name to PyTorch's.
#ifndef DDP_DDP_H_
#define DDP_DDP_H_

#include "ddp/autocast.h"
#include "ddp/checkpoint.h"
#include "ddp/comm_hooks.h"
#include "ddp/cuda_graph.h"
#include "ddp/distributed_data_parallel.h"
#include "ddp/environment.h"
#include "ddp/error.h"
#include "ddp/fingerprint.h"
#include "ddp/fused_optimizer.h"
#include "ddp/gpt.h"
#include "ddp/join.h"
#include "ddp/lr_schedule.h"
#include "ddp/lr_scheduler.h"
#include "ddp/position.h"
#include "ddp/process_group.h"
#include "ddp/recovery.h"
#include "ddp/report.h"
#include "ddp/sampler.h"
#include "ddp/sync_batch_norm.h"
#include "ddp/version.h"
#include "ddp/zero_redundancy_optimizer.h"

#endif  // DDP_DDP_H_
