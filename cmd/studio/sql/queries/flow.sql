-- name: MessageFlowGraph :many
-- The flow graph: messages summed per (source, target) address pair.
SELECT source_address, target_address, sum(messages)::bigint AS messages
FROM message_flow
WHERE occurred_at >= @since::timestamptz AND occurred_at < @until::timestamptz
GROUP BY source_address, target_address
ORDER BY source_address, target_address;
