-- +goose Up
CREATE TABLE orders (id bigint PRIMARY KEY, total_cents bigint NOT NULL);

-- +goose Down
DROP TABLE orders;
