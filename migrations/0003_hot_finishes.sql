-- Finishes become HOT updates: the new row version stays on its page and
-- no index is written.
--
-- An UPDATE is HOT only when it changes no column that an index reads
-- (key columns and partial-index predicates alike) and the new version
-- fits on the same page. Both partial indexes of 0001 filtered on
-- `status`, which every finish changes, so every finish wrote a second
-- primary-key entry, a completion-index entry and a new heap tuple
-- elsewhere. They are replaced by indexes on columns an ordinary claim and
-- finish leave alone:
--
-- * created_at: written once by the insert and never changed; new entries
--   always land on the right edge. Retention walks it oldest first (a row
--   finished before a cutoff was created before it too).
-- * uncertain_since: set while an earlier attempt of the key may have had
--   its effect (its outcome was recorded unknown, or its worker died
--   mid-call) and cleared when a done or failed outcome is stored. An
--   ordinary key never has it, so it is never in this partial index and
--   its finish leaves the column as it was. It keeps the `unknown` gauge
--   and `keys list --unknown` cheap on any table size.
--
-- Most of every page is left free for the finish of the rows a claim put
-- there: a batch claims a run of rows onto the same pages and finishes
-- them all in one statement, so each page needs room for a second version
-- of every row on it (the first one is dead only once the finish commits),
-- and the finished version is longer (it carries the answer). At 40% a
-- finished row may be half as long again as the claimed one; a longer
-- answer still finishes correctly, as an ordinary update. Existing pages
-- keep their fill; new ones follow the setting.
ALTER TABLE dedupq_keys SET (fillfactor = 40);

ALTER TABLE dedupq_keys ADD COLUMN uncertain_since timestamptz;

-- Open attempts of earlier releases are marked when they are taken over.
UPDATE dedupq_keys SET uncertain_since = updated_at WHERE status = 'unknown';

-- The `unknown` gauge (and the alert on it) counts through the index of
-- uncertain keys: an unknown key must be in it.
ALTER TABLE dedupq_keys ADD CONSTRAINT dedupq_keys_unknown_is_uncertain
    CHECK ((status <> 'unknown') OR (uncertain_since IS NOT NULL));

DROP INDEX dedupq_keys_open_by_lease;
DROP INDEX dedupq_keys_finished_by_completion;

-- One creation time per row rather than per statement: a claim inserts
-- hundreds of rows at once, and inserting hundreds of equal keys into a
-- btree (deduplication passes over posting lists) cost more than the rest
-- of the claim's inserts together.
ALTER TABLE dedupq_keys ALTER COLUMN created_at SET DEFAULT clock_timestamp();

CREATE INDEX dedupq_keys_by_creation ON dedupq_keys (created_at);

CREATE INDEX dedupq_keys_uncertain
    ON dedupq_keys (uncertain_since)
    WHERE uncertain_since IS NOT NULL;
