// `deepinfer bench sweep` (tools/cmd_bench_sweep.cpp) and `deepinfer bench
// multiturn` (tools/cmd_bench_multiturn.cpp), dispatched by `deepinfer bench`.
#pragma once

namespace deepinfer::cli {

int run_bench_sweep(int argc, char** argv);
int run_bench_multiturn(int argc, char** argv);

}  // namespace deepinfer::cli
