-- Release 1.2: pin a note to the top. A new column with a default: existing notes are unpinned.
-- Up
ALTER TABLE notes ADD COLUMN pinned INTEGER NOT NULL DEFAULT 0;

-- Down
ALTER TABLE notes DROP COLUMN pinned;
