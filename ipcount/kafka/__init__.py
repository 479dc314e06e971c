"""Kafka plumbing shared by every part: client helpers and error text, topic provisioning, and the
read_committed reader of the sink."""
