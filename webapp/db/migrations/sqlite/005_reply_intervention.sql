-- What an ablated version of a reply switched off (JSON: {"heads": ["1.0"], "mlps": [1], "mode": "zero"},
-- webapp/chat/ablation.py), so that export.json and the page say so. NULL: nothing was switched off.
ALTER TABLE messages ADD COLUMN intervention TEXT;
