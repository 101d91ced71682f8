"""Exit codes of the ``edge-node`` command: one table, each with help text (tested)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    SUCCESS = 0
    UNEXPECTED = 1
    BAD_INPUT = 2
    NETWORK = 3
    STORAGE = 4
    DIVERGED = 5
    INTERRUPTED = 130


EXIT_CODE_HELP: dict[ExitCode, str] = {
    ExitCode.SUCCESS: (
        "The command finished as asked; for `edge-node start` also a stop by SIGTERM or SIGINT (the daemon"
        " stopped cleanly: the round in progress dropped, completed rounds and the checkpoint kept)."
    ),
    ExitCode.UNEXPECTED: "An unexpected internal error; the message and a traceback (with -v) say where.",
    ExitCode.BAD_INPUT: (
        "Bad input: an invalid flag value, a missing or corrupt data set, an unknown model, an unreadable"
        " config, certificate or run directory. Nothing was written (`edge-node start` checks everything,"
        " data and checkpoint included, before it creates its state directory)."
    ),
    ExitCode.NETWORK: "A network resource could not be used: a port in use, no usable interface, no peer answered.",
    ExitCode.STORAGE: (
        "Results or state could not be written (disk full, read-only, no permission); completed rounds and"
        " checkpoints are intact: free space and run the same command again to resume."
    ),
    ExitCode.DIVERGED: (
        "Training diverged (a client's loss or weights became NaN or infinite); the run stopped before"
        " recording that round, earlier rounds are kept. Lower --lr."
    ),
    ExitCode.INTERRUPTED: (
        "Stopped by SIGINT (or, for `edge-node loopback`, SIGTERM) before finishing; completed work (rounds,"
        " checkpoints) is kept. Not `edge-node start`: a daemon told to stop exits 0."
    ),
}
