-- The features each token of a reply had (issue 49), read by the model's sparse dictionaries in the decode step
-- that sampled it (webapp/chat/decode/readings.py `saved`): JSON, NULL where none were read.
ALTER TABLE reply_details ADD COLUMN features TEXT;
