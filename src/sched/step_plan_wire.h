// A StepPlan as bytes, for the ranks of a tensor-parallel group: rank 0
// plans every step and sends it; the others run the same forward on their
// slices of the model. Only what a forward needs travels: the sampling rows'
// parameters go along (the plan's row layout), but penalties, token masks
// and logits copies are rank 0's business and are left out.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "sched/step_plan.h"

namespace deepinfer {

// Throws deepinfer::Error for a plan that cannot travel (a hidden input: MTP).
std::vector<uint8_t> encode_step_plan(const StepPlan& plan);
// Throws deepinfer::Error naming the problem for bytes that are not a plan
// (every count and index is checked against the bytes and the plan itself).
StepPlan decode_step_plan(std::span<const uint8_t> bytes);

}  // namespace deepinfer
