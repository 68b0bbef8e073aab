// The sampling RNG lives in core/ so that the backends (CPU and CUDA
// samplers) can use it; this header keeps the runner-side include path.
#pragma once

#include "core/rng.h"
