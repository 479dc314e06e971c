"""Checking a run: the generator's ground-truth ledger and the comparison of the sink against it."""
