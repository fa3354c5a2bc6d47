"""Helpers for scripts/bench, the side-by-side launch benchmark (issue 8).

Kept out of the gpusandbox package on purpose: nothing here is on a launch
path, and the benchmark must run against any installed gpusandbox."""

PREFIX = "gsbx-bench-"
