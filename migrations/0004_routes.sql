-- A key belongs to the HTTP route that first claimed it (as at Stripe, a
-- key reused on another endpoint is refused). NULL for keys claimed from
-- Kafka or RabbitMQ, which share the key space with every route. Written
-- once by the insert and never indexed, so finishes stay HOT updates.
ALTER TABLE dedupq_keys ADD COLUMN route text;
