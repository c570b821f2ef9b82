-- Release 2.0: titles are limited to 200 characters. SQLite cannot add a CHECK constraint in
-- place, so the table is rebuilt (SQLite's 12-step procedure). The engine switches foreign keys
-- off before the transaction, so dropping the old table does not cascade into note_tags, and runs
-- PRAGMA foreign_key_check before commit.
-- Up
CREATE TABLE notes_new (
    id         INTEGER PRIMARY KEY,
    title      TEXT NOT NULL CHECK (length(title) <= 200),
    body       TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    pinned     INTEGER NOT NULL DEFAULT 0
);
INSERT INTO notes_new (id, title, body, created_at, pinned)
    SELECT id, substr(title, 1, 200), body, created_at, pinned FROM notes;
DROP TABLE notes;
ALTER TABLE notes_new RENAME TO notes;
CREATE INDEX notes_by_pin_and_date ON notes (pinned DESC, created_at DESC);

-- Down
CREATE TABLE notes_old (
    id         INTEGER PRIMARY KEY,
    title      TEXT NOT NULL,
    body       TEXT NOT NULL DEFAULT '',
    created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    pinned     INTEGER NOT NULL DEFAULT 0
);
INSERT INTO notes_old (id, title, body, created_at, pinned)
    SELECT id, title, body, created_at, pinned FROM notes;
DROP TABLE notes;
ALTER TABLE notes_old RENAME TO notes;
CREATE INDEX notes_by_pin_and_date ON notes (pinned DESC, created_at DESC);
