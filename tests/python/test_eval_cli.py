"""`deepinfer eval`: generation and grading as separate steps, on the three tasks."""
import json
import subprocess
import warnings

HAS_CLOSE_ELEMENTS = (
    "    for i, a in enumerate(numbers):\n"
    "        for j, b in enumerate(numbers):\n"
    "            if i != j and abs(a - b) < threshold:\n"
    "                return True\n"
    "    return False\n"
)


def run(cmd):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if "grade" in cmd and done.returncode != 0 and "cannot make a network namespace" in done.stderr:
        # A machine that forbids namespaces: grade without network isolation
        # rather than not at all (tests/unit/eval checks the isolation where it exists).
        warnings.warn("grading without network isolation: " + done.stderr.strip())
        done = subprocess.run(cmd + ["--allow-network"], capture_output=True, text=True, timeout=600)
    return done


def test_generate_then_grade_three_tasks(cli, tmp_path):
    gen = tmp_path / "gen.jsonl"
    done = run([cli, "eval", "generate", "--task", "humaneval,mbpp,gsm8k", "--limit", "3", "--num-samples", "2",
                "--temperature", "0.8", "--seed", "1", "--max-tokens", "96", "--max-model-len", "2048", "-q",
                "--output", str(gen)])
    assert done.returncode == 0, done.stderr
    lines = [json.loads(l) for l in gen.read_text().splitlines()]
    assert len(lines) == 3 * 3 * 2
    assert {l["task"] for l in lines} == {"humaneval", "mbpp", "gsm8k"}
    assert all(l["completion_tokens"] <= 96 for l in lines)
    graded = run([cli, "eval", "grade", str(gen), "--k", "1,2", "--json", "--results", str(tmp_path / "r.jsonl")])
    assert graded.returncode == 0, graded.stderr
    summary = json.loads(graded.stdout)
    tasks = {t["task"]: t for t in summary["tasks"]}
    assert set(tasks) == {"humaneval", "mbpp", "gsm8k"}
    for t in tasks.values():
        assert t["problems"] == 3 and t["samples"] == 6 and t["samples_per_problem"] == 2
        assert 0.0 <= t["pass@1"] <= t["pass@2"] <= 1.0
    results = [json.loads(l) for l in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert len(results) == 18
    assert all(r["result"] in ("passed", "failed", "timed out") for r in results)
    # Regrading the same file gives the same verdicts without generating again.
    again = run([cli, "eval", "grade", str(gen), "--k", "1,2", "--json"])
    assert json.loads(again.stdout)["tasks"] == summary["tasks"]


def test_grading_tells_right_from_wrong(cli, tmp_path):
    gen = tmp_path / "hand.jsonl"
    rows = [
        {"task": "humaneval", "task_id": "HumanEval/0", "sample": 0, "completion": HAS_CLOSE_ELEMENTS},
        {"task": "humaneval", "task_id": "HumanEval/0", "sample": 1, "completion": "    return False\n"},
        {"task": "humaneval", "task_id": "HumanEval/0", "sample": 2, "completion": "    while True: pass\n"},
        {"task": "gsm8k", "task_id": "gsm8k/0", "sample": 0, "completion": "16 - 3 - 4 = 9; 9 * 2 = 18. The answer is 18."},
        {"task": "gsm8k", "task_id": "gsm8k/0", "sample": 1, "completion": "The answer is 20."},
        {"task": "mbpp", "task_id": "mbpp/11", "sample": 0,
         "completion": "def remove_Occ(s, ch):\n    i = s.find(ch)\n    if i >= 0: s = s[:i] + s[i+1:]\n"
                       "    j = s.rfind(ch)\n    if j >= 0: s = s[:j] + s[j+1:]\n    return s\n"},
    ]
    gen.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = run([cli, "eval", "grade", str(gen), "--k", "1,2,3", "--json", "--timeout", "2",
                "--results", str(tmp_path / "r.jsonl")])
    assert done.returncode == 0, done.stderr
    tasks = {t["task"]: t for t in json.loads(done.stdout)["tasks"]}
    assert tasks["humaneval"]["passed"] == 1 and tasks["humaneval"]["timed_out"] == 1
    assert abs(tasks["humaneval"]["pass@1"] - 1 / 3) < 1e-9
    assert tasks["humaneval"]["pass@3"] == 1.0
    assert tasks["mbpp"]["pass@1"] == 1.0
    assert tasks["gsm8k"]["passed"] == 1 and tasks["gsm8k"]["pass@1"] == 0.5
    verdicts = [json.loads(l)["result"] for l in (tmp_path / "r.jsonl").read_text().splitlines()]
    assert verdicts == ["passed", "failed", "timed out", "passed", "failed", "passed"]


def test_bad_generation_files_are_refused(cli, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task": "humaneval", "task_id": "HumanEval/99999", "completion": "x"}\n')
    done = run([cli, "eval", "grade", str(bad)])
    assert done.returncode != 0 and "HumanEval/99999" in done.stderr
    bad.write_text("not json\n")
    done = run([cli, "eval", "grade", str(bad)])
    assert done.returncode != 0 and "bad.jsonl:1" in done.stderr
    done = run([cli, "eval", "generate", "--task", "nosuch", "-o", str(tmp_path / "x.jsonl")])
    assert done.returncode != 0 and "nosuch" in done.stderr
    # A prompt longer than the context names its problem.
    done = run([cli, "eval", "generate", "--task", "humaneval", "--limit", "1", "--max-model-len", "16",
                "-o", str(tmp_path / "x.jsonl")])
    assert done.returncode != 0 and "HumanEval/0" in done.stderr and "--max-model-len" in done.stderr
