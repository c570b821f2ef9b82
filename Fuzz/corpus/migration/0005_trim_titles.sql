-- Release 1.3: apps before 1.3 saved titles with surrounding whitespace. A data fix that only
-- stores last opened by an app older than 1.3 need; newer stores record it as skipped.
-- userstore:app-version-below 1.3
-- Up
UPDATE notes SET title = trim(title) WHERE title <> trim(title);

-- Down
-- Nothing to undo: trimmed titles are valid for every version.
