"""The Loop lab: model/ (the looped transformer, torch only), the task (task.py), a request and its checks,
running and scoring a trace, its executor (runs.py), service.py and store.py, boot.py (start-up), web/ (the pages
and the JSON API)."""
