"""The Spark job: session set-up, parse -> watermark -> 5 s window count -> sink, progress lines,
the checkpoint's query id."""
