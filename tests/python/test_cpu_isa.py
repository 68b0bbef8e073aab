"""The CPU kernel level: picked from the machine, capped by DEEPINFER_CPU_ISA, every level this CPU runs works end
to end, and a bad value is a clean error."""
import os
import re
import subprocess

LEVELS = ["scalar", "avx2", "avx512", "amx"]


def generate(cli, isa):
    env = dict(os.environ)
    if isa is not None:
        env["DEEPINFER_CPU_ISA"] = isa
    return subprocess.run([cli, "generate", "-p", "The capital of France is", "-n", "6", "--temperature", "0",
                           "--threads", "2"], capture_output=True, text=True, timeout=600, env=env)


def hardware_level(cli):
    done = generate(cli, None)
    assert done.returncode == 0, done.stderr
    m = re.search(r"cpu: (\w+) kernels \(this CPU supports (\w+)\)", done.stderr)
    assert m, done.stderr
    assert m.group(1) == m.group(2), "without the variable the kernels use everything the CPU has"
    return m.group(2)


def test_every_level_this_cpu_runs_generates(cli):
    top = LEVELS.index(hardware_level(cli))
    for isa in LEVELS[: top + 1]:
        done = generate(cli, isa)
        assert done.returncode == 0, f"{isa}: {done.stderr}"
        assert f"cpu: {isa} kernels" in done.stderr
        assert "6 generated" in done.stderr, done.stderr
    for isa in LEVELS[top + 1:]:
        print(f"{isa} kernels not run: this CPU lacks them")


def test_unknown_or_unavailable_level_is_a_clean_error(cli):
    done = generate(cli, "avx1024")
    assert done.returncode != 0
    assert "unknown CPU instruction set 'avx1024'" in done.stderr
    top = hardware_level(cli)
    if top != "amx":
        done = generate(cli, LEVELS[LEVELS.index(top) + 1])
        assert done.returncode != 0
        assert f"supports at most {top}" in done.stderr


# AVX-512 and AMX instructions: 512-bit and upper-16 vector registers, mask registers, EVEX-only opcodes, tiles.
WIDE = re.compile(r"%zmm|%[xy]mm(1[6-9]|2[0-9]|3[01])\b|%k[0-7]\b|\{%k|vpternlog|vpermt2|vpermi2|vpdpbusd|vpmovdb|"
                  r"vpmovwb|kmov|tdpb|ldtilecfg|tileloadd|tilestored|tilezero|tilerelease")
ALLOWED = ("::avx512::", "::amx::", "::vec_avx512::")


def test_wider_instructions_stay_in_their_kernels(cli):
    """The binary targets AVX2; AVX-512/AMX code may only sit in the kernels that run after cpu_isa found them.

    An inline function instantiated inside an AVX-512 region and shared with baseline code would crash an
    AVX2-only machine; this scans the disassembly for any such function."""
    import shutil

    import pytest

    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("x86-64 only")
    objdump = shutil.which("objdump")
    if objdump is None:
        pytest.skip("objdump (binutils) not installed")
    out = subprocess.run([objdump, "-d", "--no-show-raw-insn", "-C", cli], capture_output=True, text=True,
                         timeout=600, check=True).stdout
    offenders, wide, fn = set(), set(), None
    for line in out.splitlines():
        if line.endswith(">:") and "<" in line:
            fn = line
        elif fn is not None and WIDE.search(line):
            wide.add(fn)
            if not any(a in fn for a in ALLOWED):
                offenders.add(fn)
    assert wide, "no AVX-512/AMX code found at all: the scan is broken or the kernels were not built"
    assert not offenders, "wide instructions outside the dispatched kernels:\n" + "\n".join(sorted(offenders)[:20])
