-- Follow links (issue 31): a presenter's revocable read-only link to what they do as it happens, on a
-- conversation (kind 'chat', target its id) or on the Loop lab (kind 'loops', target ''). `state` is what the
-- presenter's page last reported (JSON: the player's position, the trace shown), `state_version` counts the
-- reports so followers on every front end notice a new one. Revoking deletes the row.
CREATE TABLE present_links (
    token         TEXT PRIMARY KEY,
    owner         TEXT NOT NULL,
    kind          TEXT NOT NULL,
    target        TEXT NOT NULL,
    state         TEXT,
    state_version INTEGER NOT NULL DEFAULT 0,
    created_at    REAL NOT NULL,
    UNIQUE (owner, kind, target)
);
