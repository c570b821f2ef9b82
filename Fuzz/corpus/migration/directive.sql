-- userstore:app-version-below 1.3
-- Up
UPDATE t SET x = trim(x);
