"""The scale benchmarks (`make bench`); not part of `make test`.

`python -m benchmarks` runs all four; each module also runs alone (`python -m benchmarks.e2e`).
"""
