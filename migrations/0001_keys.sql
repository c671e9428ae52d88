-- One row per (tenant, key): the life of an idempotency key.
-- COLLATE "C" keeps comparison byte-exact (no case or collation folding).
CREATE TABLE dedupq_keys (
    tenant              text COLLATE "C" NOT NULL,
    key                 text COLLATE "C" NOT NULL,
    fingerprint         bytea            NOT NULL,
    fingerprint_version smallint         NOT NULL,
    status              text             NOT NULL
        CHECK (status IN ('in_progress', 'done', 'failed', 'unknown')),
    epoch               bigint           NOT NULL,
    lease_until         timestamptz,
    owner               text             NOT NULL,
    attempts            integer          NOT NULL,
    result_status       integer,
    result_body         jsonb,
    last_error          text,
    created_at          timestamptz      NOT NULL DEFAULT now(),
    updated_at          timestamptz      NOT NULL DEFAULT now(),
    completed_at        timestamptz,
    PRIMARY KEY (tenant, key),
    CHECK ((status IN ('done', 'failed')) = (completed_at IS NOT NULL))
);

-- Stuck-key scans (`keys list`, the dedupq_keys gauge) read only open rows.
CREATE INDEX dedupq_keys_open_by_lease
    ON dedupq_keys (lease_until)
    WHERE status IN ('in_progress', 'unknown');

-- Purges walk finished rows oldest first.
CREATE INDEX dedupq_keys_finished_by_completion
    ON dedupq_keys (completed_at)
    WHERE status IN ('done', 'failed');

-- Every manual intervention on a key leaves a line here.
CREATE TABLE dedupq_key_audit (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz      NOT NULL DEFAULT now(),
    tenant      text COLLATE "C" NOT NULL,
    key         text COLLATE "C" NOT NULL,
    action      text             NOT NULL,
    reason      text             NOT NULL,
    actor       text             NOT NULL,
    before      jsonb
);
