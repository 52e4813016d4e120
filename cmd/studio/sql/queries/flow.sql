-- name: MessageFlowGraph :many
-- The flow graph: messages summed per (source, target) address pair, the
-- busiest pairs first, at most @cap of them (the caller asks one more than
-- its row cap, to know whether the graph was cut).
SELECT source_address, target_address, sum(messages)::bigint AS messages
FROM message_flow
WHERE occurred_at >= @since::timestamptz AND occurred_at < @until::timestamptz
GROUP BY source_address, target_address
ORDER BY messages DESC, source_address, target_address
LIMIT @cap::int;
