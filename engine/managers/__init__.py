"""Scheduling and output: ``Req`` (one request's life), ``ScheduleBatch`` (the rows of one
forward), ``Scheduler`` (continuous batching), finish reasons and detokenization."""
