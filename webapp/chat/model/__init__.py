"""The chat model, torch only and nothing of serving: the GPT (gpt.py), its linear layers (linear.py) and
decode kernels (kernels/), precisions, architecture settings, tokenizers, the chat prompt, loading
checkpoints, and export as a Hugging Face directory."""
