"""Kafka plumbing shared by every part: client helpers and error text, topic provisioning, and the
read_committed reader of the sink."""

# fetch.wait.max.ms of the consumers that read records already there and then ask again on the
# same connection: the driver's looks at the source's tails, the sink's kept progress readers and
# its continuity probe. Such a consumer has by then asked for more at the log's end, a fetch the
# broker holds for fetch.wait.max.ms (librdkafka's default: 500 ms), and a broker answers one
# connection's requests in order: the next offset lookup or read waited behind it, ~0.5 s each.
SHORT_FETCH_WAIT_MS = "10"
