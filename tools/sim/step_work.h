// What each rank does in a step, from the packer's plan of it (StepWork,
// time_model.h): encoder passes over the images and audio clips it encodes,
// the post-balancing exchange, its LLM micro-batches, its peak activation
// memory and the images its node decodes; and the same for the naive
// baseline the planner's draw stands in for (random mini-batches, packed in
// order, text and images mixed in every micro-batch with the encoder inside
// each).
#ifndef TUTTI_TOOLS_SIM_STEP_WORK_H_
#define TUTTI_TOOLS_SIM_STEP_WORK_H_

#include "common/model_shape.h"
#include "services/packer/core/job.h"
#include "services/packer/core/plan_data.h"
#include "tools/sim/cluster.h"
#include "tools/sim/time_model.h"

namespace tutti::sim {

struct WorkOptions {
  const ModelShape* model = nullptr;
  const ClusterSpec* cluster = nullptr;
  ItemTiming timing;
  Attention attention = Attention::kFlash;
};

// From a planned step (Planner::Plan): the encoders run once per step over
// the rank's chunks, then the exchange (when items move), then the LLM's
// micro-batches (text micro-batches first), then the backward exchange.
StepWork PlannedWork(const packer::Job& job, const packer::StepPlanData& plan,
                     const WorkOptions& options);

// From a drawn step (Planner::Draw): each rank's drawn samples (the
// round-robin deal of the shuffled batch) in a shuffled order, packed next
// fit into seq_len sequences with text and VL samples together, split into
// grad_accum micro-batches of equal sequence counts, each running the
// encoder over its own images before the LLM.
StepWork NaiveWork(const packer::Job& job, const packer::StepPlanData& drawn,
                   const WorkOptions& options);

}  // namespace tutti::sim

#endif  // TUTTI_TOOLS_SIM_STEP_WORK_H_
