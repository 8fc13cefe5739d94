-- Steering directions (issue 50), per chat model (its registry name): a named vector of the model's width,
-- added after block `layer` (0-based) times a strength chosen per run. `vector` is a JSON list of floats,
-- `made` JSON saying how it was made (the prompts and where they were read, or the file it came from).
-- Shared by everyone on the server, as the models are; `owner` made it and may delete it.
CREATE TABLE directions (
    model      TEXT NOT NULL,
    name       TEXT NOT NULL,
    layer      INTEGER NOT NULL,
    vector     TEXT NOT NULL,
    norm       REAL NOT NULL,
    made       TEXT NOT NULL,
    owner      TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (model, name)
);
