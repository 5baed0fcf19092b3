"""Every command that takes seconds or a duration refuses ``nan``, ``inf``, zero (where it
means nothing), negatives and values too large for a timedelta: a usage error, one line,
before anything connects (issue 18)."""

from __future__ import annotations

import pytest

from sa_outbox.cli import build_parser

from .helpers import cli_exit


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["worker", "m:a", "--grace", "nan"], "argument --grace: must be a finite number"),
        (["worker", "m:a", "--grace=-1"], "argument --grace: must be 0 or more seconds"),
        (["worker", "m:a", "--lease", "inf"], "argument --lease: must be a finite number"),
        (["worker", "m:a", "--lease", "0"], "argument --lease: must be more than zero"),
        (["worker", "m:a", "--lease", "1e300"], "argument --lease: is too large"),
        (["worker", "m:a", "--poll-interval=-inf"], "--poll-interval: must be a finite"),
        (["worker", "m:a", "--poll-interval", "NaN"], "--poll-interval: must be a finite"),
        (
            ["prune", "--model", "m:J", "--older-than", "0d"],
            "argument --older-than: must be more than",
        ),
        (["prune", "--model", "m:J", "--older-than", "99999999999w"], "--older-than: is too large"),
        (
            ["prune", "--model", "m:J", "--older-than", "1d", "--outbox-older-than", "0s"],
            "more than zero",
        ),
        (["partitions", "maintain", "--model", "m:J", "--retention", "0h"], "more than zero"),
        (["jobs", "enqueue", "k", "--payload", "{}", "--model", "m:J", "--delay", "0s"], "zero"),
    ],
)
def test_durations_must_be_finite_and_positive(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    *usage, error = cli_exit(capsys, argv, 2)[1].splitlines()
    assert usage[0].startswith("usage: sa-outbox ")
    assert ": error: argument " in error and message in error  # one line says it all


def test_a_grace_of_zero_is_allowed() -> None:
    args = build_parser().parse_args(["worker", "m:a", "--grace", "0"])
    assert args.grace == 0.0  # Worker(grace=0): running jobs are released at once
