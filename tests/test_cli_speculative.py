"""`--draft` and `--speculate-k` on the command line, run for real: the same greedy text as plain
decode, the speculative path in `compare`, `bench --speculate`, and one clear line for bad input."""

from __future__ import annotations

import json

from test_cli import home, ok, run, user_error  # noqa: F401  (home is a fixture)


def test_generate_with_either_draft_writes_plain_greedys_text(home):
    args = ("generate", "ROMEO:", "--max-new-tokens", "12")
    plain = ok(run(home, *args))
    for draft in ("ngram", "random-tiny"):
        spec = ok(run(home, *args, "--draft", draft, "--speculate-k", "3"))
        assert spec.stdout == plain.stdout
        assert f"speculative, draft {draft}, k 3" in spec.stderr and "guesses accepted" in spec.stderr


def test_compare_puts_speculative_decode_beside_naive_and_cached(home):
    r = ok(run(home, "compare", "ROMEO:", "--max-new-tokens", "8", "--speculate-k", "2"))
    out = r.stdout
    assert "speculative (draft ngram, k 2)" in out
    assert "✓ speculative: identical tokens to cached" in out and "✓ naive: identical tokens" in out
    assert "the speed of cached decode" in out and "tokens per step of the model" in out
    none = ok(run(home, "compare", "ROMEO:", "--max-new-tokens", "4", "--draft", "none"))
    assert "speculative" not in none.stdout


def test_bench_speculate_json(home):
    r = ok(run(home, "bench", "--speculate", "1,3", "--model", "default", "--draft", "ngram,random-tiny",
               "--prompts", "1", "--new-tokens", "8", "--repeats", "1", "--json"))
    result = json.loads(r.stdout)
    assert [(x["draft"], x["k"]) for x in result["rows"]] == [("ngram", 1), ("ngram", 3), ("random-tiny", 1),
                                                              ("random-tiny", 3)]
    for x in result["rows"]:
        assert x["same_tokens"] is True
        assert 1.0 <= x["tokens_per_step"] <= x["k"] + 1 and 0.0 <= x["acceptance"] <= 1.0
    assert result["plain"]["tok_s"] > 0 and result["model"] == "minillm-shakespeare"


def test_bench_speculate_fits_80_columns(home):
    from test_cli import cli_env
    r = ok(run(home, "bench", "--speculate", "1,2", "--model", "default", "--draft", "ngram,random-tiny",
               "--prompts", "1", "--new-tokens", "6", "--repeats", "1", env=cli_env(home, COLUMNS="80")))
    assert "random-tiny" in r.stdout and "every run gave plain greedy decode's tokens" in r.stdout
    assert "…" not in r.stdout and max(len(line) for line in r.stdout.splitlines()) <= 80


def test_bad_speculative_options_are_one_clear_line(home):
    user_error(run(home, "generate", "ROMEO:", "--speculate-k", "0", "--draft", "ngram"), "--speculate-k")
    user_error(run(home, "generate", "ROMEO:", "--draft", "ngram", "--no-cache"), "--draft", "--no-cache")
    user_error(run(home, "generate", "ROMEO:", "--draft", "no-such-model"), "no-such-model")
    user_error(run(home, "compare", "ROMEO:", "--speculate-k", "99"), "--speculate-k")
    user_error(run(home, "bench", "--speculate", "0"), "--speculate")
    user_error(run(home, "bench", "--speculate", "2", "--batch", "2"), "--batch", "--speculate")
    user_error(run(home, "generate", "ROMEO:", "--draft", "small"), "the model itself")
    user_error(run(home, "bench", "--speculate", "2", "--model", "small", "--draft", "small"), "the model itself")


def test_one_new_token_with_a_draft_says_no_guesses_were_made(home):
    r = ok(run(home, "generate", "ROMEO:", "--max-new-tokens", "1", "--draft", "ngram"))
    assert "no guesses were made" in r.stderr


def test_sampling_with_a_draft_says_the_draws_differ(home):
    r = ok(run(home, "generate", "ROMEO:", "--max-new-tokens", "6", "--draft", "random-tiny", "--temperature", "0.8",
               "--seed", "1"))
    assert "follows the model's own distribution" in r.stderr
