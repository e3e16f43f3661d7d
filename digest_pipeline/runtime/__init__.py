"""How delivery and the bulk steps run: wave engine, thread pools, forked helpers, tuning.

The services say what happens to an item; this layer decides on which threads and processes,
and how the interpreter is tuned while it happens. It drives the services and is handed to
them by the composition root (`wiring.py`), so the services never import it.
"""
