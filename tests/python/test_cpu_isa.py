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
