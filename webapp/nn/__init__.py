"""Code the chat model and the Loop lab's looped transformer both use (neither imports the other)."""
