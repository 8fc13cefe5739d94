-- Glassbox's SQLite schema. Every row belongs to the browser (owner) that made it.
CREATE TABLE IF NOT EXISTS conversations (
    id          TEXT PRIMARY KEY,
    owner       TEXT NOT NULL,
    title       TEXT NOT NULL,
    created_at  REAL NOT NULL,
    updated_at  REAL NOT NULL,
    leaf_id     INTEGER        -- the newest message of the branch shown (messages form a tree)
);
CREATE INDEX IF NOT EXISTS conversations_by_owner ON conversations (owner, updated_at DESC);

CREATE TABLE IF NOT EXISTS messages (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    role            TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
    content         TEXT NOT NULL,
    -- pending while a job produces it; then complete, stopped or error
    status          TEXT NOT NULL DEFAULT 'complete',
    error           TEXT,
    settings        TEXT,          -- JSON: the sampling settings of an assistant reply
    tokens          INTEGER,
    ttft_seconds    REAL,
    tokens_per_second REAL,
    wait_seconds    REAL,          -- time the reply waited in line for a free row, apart from its first token
    created_at      REAL NOT NULL,
    -- the message this one answers or follows; versions of a message (a regenerated reply, an edited
    -- question, a branch from a token) share a parent: the conversation is a tree, shown one branch at a time
    parent_id       INTEGER REFERENCES messages (id) ON DELETE CASCADE,
    token_view      INTEGER NOT NULL DEFAULT 0  -- 1: the owner reads this reply as its tokens, shaded by their odds
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages (conversation_id, id);
-- a message's versions and replies; also what each deleted message's ON DELETE CASCADE looks up
CREATE INDEX IF NOT EXISTS messages_by_parent ON messages (parent_id);

CREATE TABLE IF NOT EXISTS traces (
    id          TEXT PRIMARY KEY,
    owner       TEXT NOT NULL,
    snapshot    TEXT NOT NULL,     -- JSON: the final snapshot (schema_version 1)
    created_at  REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS traces_by_owner ON traces (owner, created_at DESC);

-- What a reply's glass-box views show: the exact prompt it was given (ids, parts, budget) and each
-- generated token's odds (webapp/chat/decode/odds.py), compact JSON; bounded by the window and the reply length.
CREATE TABLE IF NOT EXISTS reply_details (
    message_id  INTEGER PRIMARY KEY REFERENCES messages (id) ON DELETE CASCADE,
    prompt      TEXT,
    odds        TEXT
);

-- Read-only links to a conversation, made on purpose by its owner and revocable: whoever has the token
-- may read the branch shown (no editing, no new replies).
CREATE TABLE IF NOT EXISTS conversation_shares (
    token           TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL UNIQUE REFERENCES conversations (id) ON DELETE CASCADE,
    created_at      REAL NOT NULL
);

-- Read-only links to a trace, made on purpose by its owner and revocable, as for conversations.
CREATE TABLE IF NOT EXISTS trace_shares (
    token       TEXT PRIMARY KEY,
    trace_id    TEXT NOT NULL UNIQUE REFERENCES traces (id) ON DELETE CASCADE,
    created_at  REAL NOT NULL
);

-- The browsers that own rows (webapp/browsers.py): the address that made each, when, and when it was
-- last seen (written once a day at most), for the per-address limit and the retention of idle browsers.
CREATE TABLE IF NOT EXISTS browsers (
    owner       TEXT PRIMARY KEY,
    address     TEXT NOT NULL,
    created_at  REAL NOT NULL,
    seen_at     REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS browsers_by_address ON browsers (address, created_at);
CREATE INDEX IF NOT EXISTS browsers_by_seen ON browsers (seen_at);
