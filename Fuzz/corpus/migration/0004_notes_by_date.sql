-- Release 1.2: the note list is sorted by pin, then date; index it.
-- Up
CREATE INDEX notes_by_pin_and_date ON notes (pinned DESC, created_at DESC);

-- Down
DROP INDEX notes_by_pin_and_date;
