"""The benchmark suite (issue 7): sa-outbox side by side with raw SQL and its Python peers.

Not part of the wheel. Run it from a clone with ``nox -s bench`` (or ``python -m benchmarks``
in an environment with the ``bench`` extra installed); see docs/benchmarks.md.

Example:
    python -m benchmarks --quick --out /tmp/bench
    python -m benchmarks --workloads W4,W5 --systems raw,sa-sync,pgqueuer --runs 3
"""
