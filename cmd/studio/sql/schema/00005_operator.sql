-- +goose Up
-- Operators may see what every limit holds and refuses (GET /limits, GET
-- /api/limits): permit holders, throttled usernames, token names. Other
-- users get 403 forbidden there.
ALTER TABLE app_user ADD COLUMN operator boolean NOT NULL DEFAULT false;

-- +goose Down
ALTER TABLE app_user DROP COLUMN operator;
