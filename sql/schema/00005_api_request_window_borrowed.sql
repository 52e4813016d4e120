-- +goose Up

-- borrowed: the units the key's last borrow took (ratelimit.Options.Borrow,
-- APIRequestWindowBorrow), which that statement returns so the replica
-- knows where its batch begins on the key's TAT. Only the borrow writes it.
ALTER TABLE pglimit.api_request_window ADD COLUMN borrowed integer NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE pglimit.api_request_window DROP COLUMN borrowed;
