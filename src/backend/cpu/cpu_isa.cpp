#include "backend/cpu/cpu_isa.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace deepinfer::cpu {

namespace {

#if defined(__x86_64__)
struct CpuidBits {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
};

CpuidBits cpuid(unsigned leaf, unsigned subleaf) {
  CpuidBits r;
  if (!__get_cpuid_count(leaf, subleaf, &r.eax, &r.ebx, &r.ecx, &r.edx)) return {};
  return r;
}

bool bit(unsigned word, int n) { return (word >> n) & 1u; }

// XCR0: which register states the OS saves on a context switch. An
// instruction set is usable only when its state is among them.
unsigned long long xcr0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

// Linux hands out AMX tile data state only on request (it makes signal frames
// larger); without the grant the first tile instruction faults.
bool request_amx_tile_state() {
#if defined(SYS_arch_prctl)
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
  return false;
#endif
}

CpuIsa detect() {
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
  return CpuIsa::Scalar;  // built for a baseline below AVX2: only the portable kernels exist
#endif
  const CpuidBits l1 = cpuid(1, 0);
  const bool osxsave = bit(l1.ecx, 27);
  if (!osxsave) return CpuIsa::Scalar;
  const unsigned long long xcr = xcr0();
  const bool ymm_state = (xcr & 0x6) == 0x6;          // SSE + AVX
  const bool zmm_state = (xcr & 0xE6) == 0xE6;        // + opmask, upper zmm, zmm16..31
  const CpuidBits l7 = cpuid(7, 0);
  const bool avx2 = bit(l7.ebx, 5) && bit(l1.ecx, 12) /* fma */ && bit(l1.ecx, 29) /* f16c */;
  if (!(avx2 && ymm_state)) return CpuIsa::Scalar;
  const bool avx512 = bit(l7.ebx, 16) /* f */ && bit(l7.ebx, 17) /* dq */ && bit(l7.ebx, 30) /* bw */ &&
                      bit(l7.ebx, 31) /* vl */ && bit(l7.ecx, 11) /* vnni */;
  if (!(avx512 && zmm_state)) return CpuIsa::Avx2;
  const bool amx = bit(l7.edx, 24) /* tile */ && bit(l7.edx, 25) /* int8 */;
  if (!(amx && request_amx_tile_state())) return CpuIsa::Avx512;
  return CpuIsa::Amx;
}
#else
CpuIsa detect() { return CpuIsa::Scalar; }
#endif

CpuIsa choose() {
  const CpuIsa hardware = hardware_isa();
  const char* env = std::getenv("DEEPINFER_CPU_ISA");
  if (env == nullptr || *env == '\0') return hardware;
  const CpuIsa wanted = parse_isa(env);
  DI_CHECK(static_cast<int>(wanted) <= static_cast<int>(hardware),
           "DEEPINFER_CPU_ISA={}: this CPU (or this build) supports at most {}", env, isa_name(hardware));
  return wanted;
}

}  // namespace

std::string_view isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Scalar: return "scalar";
    case CpuIsa::Avx2: return "avx2";
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Amx: return "amx";
  }
  return "?";
}

CpuIsa parse_isa(std::string_view name) {
  for (CpuIsa isa : {CpuIsa::Scalar, CpuIsa::Avx2, CpuIsa::Avx512, CpuIsa::Amx}) {
    if (name == isa_name(isa)) return isa;
  }
  throw Error("unknown CPU instruction set '" + std::string(name) + "' (expected scalar, avx2, avx512 or amx)");
}

CpuIsa hardware_isa() {
  static const CpuIsa isa = detect();
  return isa;
}

CpuIsa active_isa() {
  static const CpuIsa isa = choose();
  return isa;
}

}  // namespace deepinfer::cpu
