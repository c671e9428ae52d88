-- The key table becomes hash-partitioned on its primary key.
--
-- With one table, each claim of a new key descends to a random leaf of one
-- primary-key index that grows with every stored key (600 MB at 10 million
-- keys): its pages no longer stay in memory, and the first change to each
-- leaf after a checkpoint writes a full-page image to the WAL. Split by a
-- hash of (tenant, key), each partition's index is a fraction of that size,
-- and claims, finishes and purges reach one partition per key.
--
-- The number of partitions is chosen when this migration runs, from the
-- `dedupq.partitions` setting of the migrating session (`dedupq migrate
-- --partitions N`, or `store.partitions`; 16 when unset). Changing it later
-- does nothing: the partitions exist from then on.
--
-- Rows already stored are kept as they are: the table is renamed, the
-- partitioned one created with the same columns (in the same order),
-- defaults, constraints and fill factor, every row copied, the indexes
-- built on the filled partitions, the privileges of the old table granted
-- on the new one and on each partition, and the old table dropped. The
-- whole migration is one transaction: a reader sees either table, whole.
-- It holds the old table exclusively while it copies (minutes at millions
-- of keys): run it during a deploy, as every migration.
--
-- The audit table has no foreign key to this one and stays as it is.

ALTER TABLE dedupq_keys RENAME TO dedupq_keys_unpartitioned;
ALTER INDEX dedupq_keys_pkey RENAME TO dedupq_keys_unpartitioned_pkey;
ALTER INDEX dedupq_keys_by_creation RENAME TO dedupq_keys_unpartitioned_by_creation;
ALTER INDEX dedupq_keys_uncertain RENAME TO dedupq_keys_unpartitioned_uncertain;

-- The columns of 0001–0004, in their order. The constraints keep the
-- names PostgreSQL gave them on the first table. The primary key is
-- declared after the copy, with the other indexes.
CREATE TABLE dedupq_keys (
    tenant               text COLLATE "C" NOT NULL,
    key                  text COLLATE "C" NOT NULL,
    fingerprint          bytea            NOT NULL,
    fingerprint_version  smallint         NOT NULL,
    status               text             NOT NULL,
    epoch                bigint           NOT NULL,
    lease_until          timestamptz,
    owner                text             NOT NULL,
    attempts             integer          NOT NULL,
    result_status        integer,
    result_body          bytea,
    last_error           text,
    created_at           timestamptz      NOT NULL DEFAULT clock_timestamp(),
    updated_at           timestamptz      NOT NULL DEFAULT now(),
    completed_at         timestamptz,
    result_content_type  text,
    request_body         bytea,
    request_content_type text,
    derived_key          text,
    attempt_open         boolean          NOT NULL DEFAULT false,
    uncertain_since      timestamptz,
    route                text,
    CONSTRAINT dedupq_keys_status_check
        CHECK (status IN ('in_progress', 'done', 'failed', 'unknown')),
    CONSTRAINT dedupq_keys_check
        CHECK ((status IN ('done', 'failed')) = (completed_at IS NOT NULL)),
    CONSTRAINT dedupq_keys_unknown_is_uncertain
        CHECK ((status <> 'unknown') OR (uncertain_since IS NOT NULL))
) PARTITION BY HASH (tenant, key);

-- The partitions, named dedupq_keys_p0000, dedupq_keys_p0001, …
DO $$
DECLARE
    setting text := nullif(btrim(current_setting('dedupq.partitions', true)), '');
    partitions integer;
BEGIN
    IF setting IS NULL THEN
        partitions := 16;
    ELSIF setting !~ '^[0-9]{1,5}$' THEN
        RAISE EXCEPTION 'dedupq.partitions = % is not a whole number', quote_literal(setting)
            USING HINT = 'set store.partitions (or dedupq migrate --partitions) to 1..1024';
    ELSE
        partitions := setting::integer;
    END IF;
    IF partitions < 1 OR partitions > 1024 THEN
        RAISE EXCEPTION 'dedupq.partitions = % is out of range: the key table takes 1 to 1024 partitions', partitions
            USING HINT = 'set store.partitions (or dedupq migrate --partitions) to 1..1024';
    END IF;
    FOR i IN 0 .. partitions - 1 LOOP
        EXECUTE format(
            'CREATE TABLE %I PARTITION OF dedupq_keys '
            'FOR VALUES WITH (MODULUS %s, REMAINDER %s)',
            'dedupq_keys_p' || lpad(i::text, 4, '0'), partitions, i);
    END LOOP;
END
$$;

-- Every key and outcome, as stored. The rows are copied packed, as they
-- mostly were (0003 left existing pages full): finished rows are not
-- updated again, and a table of millions of keys keeps its size.
INSERT INTO dedupq_keys SELECT * FROM dedupq_keys_unpartitioned;

-- A partitioned table holds no rows and takes no fill factor: each
-- partition takes 0003's for the pages claims fill from now on, so
-- finishes stay HOT updates.
DO $$
DECLARE
    part regclass;
BEGIN
    FOR part IN
        SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'dedupq_keys'::regclass
    LOOP
        EXECUTE format('ALTER TABLE %s SET (fillfactor = 40)', part);
    END LOOP;
END
$$;

-- The indexes of 0001 and 0003, built once over the filled partitions.
ALTER TABLE dedupq_keys ADD CONSTRAINT dedupq_keys_pkey PRIMARY KEY (tenant, key);

CREATE INDEX dedupq_keys_by_creation ON dedupq_keys (created_at);

CREATE INDEX dedupq_keys_uncertain
    ON dedupq_keys (uncertain_since)
    WHERE uncertain_since IS NOT NULL;

-- The new tables belong to the old one's owner (who may not be the role
-- migrating, e.g. a superuser). Whoever could read or write the old table
-- can do the same with the new one, and with each partition (read directly
-- by operators). The owner's own rights come with ownership. ALTER DEFAULT
-- PRIVILEGES may already have granted some of these: granting twice
-- changes nothing.
DO $$
DECLARE
    old regclass := 'dedupq_keys_unpartitioned'::regclass;
    owner_name text := (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = old);
    grant_sql text;
    target regclass;
BEGIN
    FOR target IN
        SELECT 'dedupq_keys'::regclass
        UNION ALL
        SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'dedupq_keys'::regclass
    LOOP
        IF (SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = target) <> owner_name THEN
            EXECUTE format('ALTER TABLE %s OWNER TO %I', target, owner_name);
        END IF;
    END LOOP;
    FOR grant_sql IN
        SELECT format('GRANT %s ON TABLE %%s TO %s%s',
                      a.privilege_type,
                      CASE WHEN a.grantee = 0 THEN 'PUBLIC'
                           ELSE quote_ident(pg_get_userbyid(a.grantee)) END,
                      CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END)
        FROM pg_class c, aclexplode(c.relacl) AS a
        WHERE c.oid = old AND a.grantee <> c.relowner
    LOOP
        FOR target IN
            SELECT 'dedupq_keys'::regclass
            UNION ALL
            SELECT inhrelid::regclass FROM pg_inherits WHERE inhparent = 'dedupq_keys'::regclass
        LOOP
            EXECUTE format(grant_sql, target);
        END LOOP;
    END LOOP;
END
$$;

DROP TABLE dedupq_keys_unpartitioned;
