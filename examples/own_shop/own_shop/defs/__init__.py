"""The shop's definitions: its tables, the digest's executor and two digest instances."""
