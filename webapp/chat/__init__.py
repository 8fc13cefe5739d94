"""Chat: model/ (the GPT, torch only), decode/ (what the core's worker runs for a reply), service.py and
store.py (a reply checked, saved and submitted), boot.py (start-up), web/ (the pages), export.py (the command)."""
