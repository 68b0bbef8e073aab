// Which vector instruction set the CPU kernels use, chosen at run time so that
// one binary runs on every x86-64 server it was built for and uses the widest
// units each one has.
#pragma once

#include <string_view>

namespace deepinfer::cpu {

// Ordered: each level includes the ones below it.
enum class CpuIsa : int {
  Scalar = 0,  // portable C++ (the reference every other level is tested against)
  Avx2 = 1,    // AVX2 + FMA + F16C
  Avx512 = 2,  // AVX-512 F/BW/VL/DQ + VNNI, with the OS saving the zmm state
  Amx = 3,     // AVX-512 level + AMX tiles (int8), with the OS granting tile state
};

std::string_view isa_name(CpuIsa isa);

// Throws deepinfer::Error naming the accepted values.
CpuIsa parse_isa(std::string_view name);

// The highest level this build has kernels for and this CPU and OS can run.
CpuIsa hardware_isa();

// The level the kernels use: hardware_isa(), or lower when the environment
// variable DEEPINFER_CPU_ISA names a lower one (to compare paths or to mimic
// an older machine). Naming a level the machine lacks throws deepinfer::Error.
CpuIsa active_isa();

inline bool isa_available(CpuIsa isa) { return static_cast<int>(isa) <= static_cast<int>(hardware_isa()); }

}  // namespace deepinfer::cpu
