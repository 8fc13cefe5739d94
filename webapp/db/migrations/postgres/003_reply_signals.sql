-- What another front end asked about a pending reply it does not run (several front ends on one
-- database, docs/scaling.md): Stop pressed there, or its stream followed there. The front end that runs
-- the reply reads them each time it saves the reply so far (ChatStore.save_progress).
CREATE TABLE reply_signals (
    message_id      BIGINT PRIMARY KEY REFERENCES messages (id) ON DELETE CASCADE,
    stop_requested  INTEGER NOT NULL DEFAULT 0,
    followed        INTEGER NOT NULL DEFAULT 0
);
