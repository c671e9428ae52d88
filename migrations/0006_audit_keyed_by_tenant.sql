-- The audit table's primary key holds the tenant and the key.
--
-- A distributed PostgreSQL (Citus, docs/scale-out.md) enforces a unique
-- index only inside one shard, so it refuses to distribute a table whose
-- primary key lacks the distribution column. The key table's primary key
-- is (tenant, key); the audit table's was its line number alone. Keyed by
-- (tenant, key, id), it can be distributed by tenant (or by key, for a
-- tenant too large for one shard) and co-located with the key table, so
-- an intervention's update and its audit line commit on one shard.
--
-- Line numbers stay as they are and still come from the identity column,
-- so they stay unique; the index now also serves `dedupq keys audit` of
-- one tenant or one key. No row is rewritten: the new index is built over
-- the existing lines, under the migrate lock, in one statement (re-run on
-- a table already keyed this way, it builds the same index again).
ALTER TABLE dedupq_key_audit
    DROP CONSTRAINT IF EXISTS dedupq_key_audit_pkey,
    ADD CONSTRAINT dedupq_key_audit_pkey PRIMARY KEY (tenant, key, id);
