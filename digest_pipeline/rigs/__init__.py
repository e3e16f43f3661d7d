"""The rigs: the simulator, the chaos harness and the loopback servers tests and benchmarks share.

They live in the package, not in the tests, so the benchmarks never have to import the tests.
The production faces (`cli`, `defs`) never import them, except `cli/simulate.py` as a thin face.
"""
