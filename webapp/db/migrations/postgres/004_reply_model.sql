-- Which model wrote a reply (its registry name, its checkpoint's file id, its precision), so that Inside,
-- branching and Regenerate run that model or say it is not here; and the model a conversation was started
-- with. NULL: saved before replies kept their model ("model not recorded").
ALTER TABLE conversations ADD COLUMN model TEXT;
ALTER TABLE messages ADD COLUMN model TEXT;
ALTER TABLE messages ADD COLUMN model_file TEXT;
ALTER TABLE messages ADD COLUMN model_precision TEXT;
