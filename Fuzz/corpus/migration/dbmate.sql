-- migrate:up
CREATE TABLE d (x);
-- migrate:down
DROP TABLE d;
