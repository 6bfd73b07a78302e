"""The `minillm` command: one module per group of subcommands, registered from one table in
`commands` (which imports only the command it runs). `minillm.cli.main` is the command's function.

    commands    COMMANDS, the parser, --threads, errors as one line, `main`
    common      what the commands share: --model, sampling and KV options, loading, prompt checks
    console     the two consoles: results on stdout, progress and errors on stderr
    generate    `generate`              chat      `chat`
    batch       `generate-batch`        compare   `compare`, `traffic`
    diagnose    `diagnose`              bench     `bench`
    hardware    `hardware`              serve     `serve`
    serve_sim   `serve-sim`             loadgen   `loadgen`
    monitor     `monitor`               download  `download`
    quantize    `quantize`              train     `train`, `eval`
    learn       `learn`
    bench_modes, bench_options   `bench`'s modes and tables, and what its lists mean
"""

from .. import _starting_the_command

try:
    from .commands import build_parser, main
except KeyboardInterrupt:          # Ctrl-C while the command's modules load: exit quietly
    if _starting_the_command():
        raise SystemExit(130) from None
    raise

__all__ = ["build_parser", "main"]
