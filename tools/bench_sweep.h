// `deepinfer bench sweep` (tools/cmd_bench_sweep.cpp), dispatched by `deepinfer bench`.
#pragma once

namespace deepinfer::cli {

int run_bench_sweep(int argc, char** argv);

}  // namespace deepinfer::cli
