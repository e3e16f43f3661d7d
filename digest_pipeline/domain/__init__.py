"""The pure core: periods and keys, states, failure classes, retry policy and the cleanup gate.

Nothing here reads the clock, the network, the disk or the environment, so every rule can be
tested with plain values.
"""
