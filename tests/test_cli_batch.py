"""`minillm generate-batch` and `minillm bench --batch`, run for real as subprocesses, and the
counting-code-removed copy covering the paged cache's reports too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

import minillm
from minillm.cache.paged import PagedKVPool
from minillm.measure import bench

REPO = Path(__file__).resolve().parent.parent


def run(tmp_path, *args, stdin=None):
    env = dict(os.environ) | {"MINILLM_HOME": str(tmp_path), "MINILLM_FAST": "1", "PYTHONIOENCODING": "utf-8"}
    env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-m", "minillm", *map(str, args)], input=stdin, capture_output=True,
                          text=True, encoding="utf-8", cwd=REPO, env=env, timeout=180)


def clean_error(r, *words):
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) <= 3, r.stderr
    for w in words:
        assert w in r.stderr, (w, r.stderr)


def test_generate_batch_json_equals_generate_alone(tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text('ROMEO:\n\n{"prompt": "JULIET:", "max_new_tokens": 3, "seed": 5}\nKING:\n')
    r = run(tmp_path, "generate-batch", prompts, "--model", "random-tiny", "--max-new-tokens", "6",
            "--temperature", "0.9", "--seed", "2", "--json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [row["prompt"] for row in rows] == ["ROMEO:", "JULIET:", "KING:"]
    model, enc = minillm.load("random-tiny", quiet=True), minillm.tokenizer()
    for row, n, seed in zip(rows, (6, 3, 6), (2, 5, 2)):
        assert row["tokens"] == minillm.generate(model, enc.encode(row["prompt"]), n, temperature=0.9, seed=seed)


def test_generate_batch_compare_reports_identical_tokens(tmp_path):
    r = run(tmp_path, "generate-batch", "-", "--model", "random-tiny", "--max-new-tokens", "4", "--compare",
            stdin="a\nb c\n")
    assert r.returncode == 0, r.stderr
    flat = " ".join(r.stdout.split())
    assert "identical tokens for 2 of 2 prompts" in flat and "batched steps" in flat
    assert "medians of 6 interleaved rounds" in flat                 # ranked by the verdict rule
    assert ", faster, " in flat or ", slower, " in flat or ", no winner (" in flat
    assert "paired rounds" in flat or "by an exact sign test" in flat


def test_generate_batch_bad_input(tmp_path):
    clean_error(run(tmp_path, "generate-batch", tmp_path / "nope.txt"), "nope.txt", "no such file")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n \n")
    clean_error(run(tmp_path, "generate-batch", empty), "no prompts")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('x\n{"prompt": 3}\n')
    clean_error(run(tmp_path, "generate-batch", bad), "line 2", "prompt")
    long = tmp_path / "long.txt"
    long.write_text("short\n" + "word " * 300 + "\n")
    clean_error(run(tmp_path, "generate-batch", long, "--model", "random-tiny"), "line 2", "context")


def test_bench_batch_json(tmp_path):
    r = run(tmp_path, "bench", "--model", "random-tiny", "--batch", "1,2,3", "--repeats", "1", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    rows = result["rows"]
    assert [row["batch"] for row in rows] == [1, 2, 3]
    for row in rows:
        for key in ("tok_s", "ms_step", "intensity", "gbps", "gflops", "roofline_ms", "bare_plain_ms",
                    "bare_engine_ms"):
            assert row[key] > 0, key
        assert row["bound"] in ("memory", "compute")
    assert rows[0]["bytes"] < rows[2]["bytes"] < 2 * rows[0]["bytes"]    # weights counted once per step
    assert rows[2]["flops"] > 2.5 * rows[0]["flops"]
    assert result["critical_batch"] is None or result["critical_batch"] >= 1
    assert result["b1_of_bare"] > 0
    clean_error(run(tmp_path, "bench", "--model", "random-tiny", "--batch", "1,x"), "--batch")
    clean_error(run(tmp_path, "bench", "--model", "random-tiny", "--batch", "0"), "--batch")


def test_counting_code_removed_covers_the_paged_cache_and_batched_decode():
    """With the counting code cut out, a batched paged decode step reports nothing and computes the same."""
    model = minillm.load("random-tiny", quiet=True)

    def batched_step():
        pool = PagedKVPool(model.config, 16, 4)
        caches = [pool.sequence() for _ in range(3)]
        for c in caches:
            c.reserve(4)
        model.step([([1, 2, 3], c) for c in caches])
        return model.step([([4], c) for c in caches])       # a batched decode: one gather per layer

    with minillm.Meter() as counted:
        expected = batched_step()
    with bench.counting_code_removed():
        with minillm.Meter() as m:
            got = batched_step()
        assert all(s.total_bytes == 0 and s.total_flops == 0 for s in m.steps)
    for a, b in zip(got, expected):
        np.testing.assert_array_equal(a, b)
    with minillm.Meter() as again:                     # restored afterwards
        batched_step()
    assert again.total("total_bytes") == counted.total("total_bytes") > 0
