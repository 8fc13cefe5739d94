"""`python -m webapp.features train`: sparse dictionaries of a chat model's residual stream, trained here (the package
is webapp/chat/features; docs/features.md)."""
