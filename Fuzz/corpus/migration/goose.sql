-- +goose Up
CREATE TABLE g (x);
-- +goose Down
DROP TABLE g;
