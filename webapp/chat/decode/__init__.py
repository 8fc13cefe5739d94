"""What the core's worker runs for a chat reply: request and result types (types.py), sampling, the sequence and
the decode step (generate.py), the batched and the one-at-a-time executors, each token's odds, kept KV caches,
and replies from OpenAI-compatible servers (remote/)."""
