-- Labels people wrote for the features of a sparse dictionary (issue 49), shared by everyone on the server as the
-- dictionaries are: per chat model (its registry name), dictionary (its folder's name) and that dictionary's
-- fingerprint (one trained again into the same folder starts unlabelled), one per feature. `owner` wrote it.
CREATE TABLE feature_labels (
    model       TEXT NOT NULL,
    dictionary  TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    feature     INTEGER NOT NULL,
    label       TEXT NOT NULL,
    owner       TEXT NOT NULL,
    created_at  REAL NOT NULL,
    PRIMARY KEY (model, dictionary, fingerprint, feature)
);
