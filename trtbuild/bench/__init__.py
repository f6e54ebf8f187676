"""Serving measurements: `trtbuild bench` starts an artifact's runtime with its packaged options,
drives the recipe's workloads with an established load generator, and records what it measured
(records.py) beside the artifact, never in it (docs/bench.md)."""
