"""How much a delivery worker leases and sends at once: pure sizing from its settings.

The claim and the wave are bounds on risk (how many leases can run out behind a slow provider,
how many sends are open at a time), so they are decided here, once, not where they are used.
"""

#: a delivery step leases this many waves' worth of items at a time
CLAIM_WAVES = 8
#: over a database server the next claim is taken on a thread of its own once no more than this
#: many waves are left queued: a claim of `CLAIM_WAVES` waves and its content takes about as
#: long as composing and starting four of a local mailer's waves
AHEAD_WAVES = 4


def claim_size(batch_size: int, concurrency: int) -> int:
    """Items a delivery step leases at a time: a few waves' worth, never the whole batch.

    A step works through `batch_size` items; leasing them all at once would let the last ones'
    leases run out behind a slow provider.
    """
    return min(batch_size, CLAIM_WAVES * concurrency)


def wave_shape(concurrency: int, remote: bool = True) -> tuple[int, int]:
    """(items a wave, waves in flight) for a worker of `concurrency` sends.

    Waves in flight times wave size never exceeds `concurrency`. Overlapping waves keep a remote
    provider's sends going while this thread records; several small waves keep slow sends from
    idling the pool for long, and a floor of 8 items keeps the statements per item low. A local
    mailer's sends end before the ledger has recorded anything, so overlap would buy nothing:
    one wave of `concurrency` a time, half the transactions of two overlapped ones.
    """
    if concurrency < 2 or not remote:
        return concurrency, 1
    size = max(1, min(concurrency // 2, max(8, concurrency // 4)))
    return size, concurrency // size
