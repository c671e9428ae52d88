-- What the provider answered and what it was sent, byte for byte.
--
-- result_body becomes bytes: a provider answer is stored exactly as it
-- arrived (jsonb refused `\u0000` and re-wrote numbers), with its content
-- type. The request of the first attempt (bytes, content type, derived
-- provider key) is kept with the key, so every retry and takeover sends
-- exactly that request, whichever copy of the message triggers it.
--
-- attempt_open is true from a claim until that attempt's outcome is
-- written: a row taken over while it is still true belonged to a worker
-- that died or lost its lease mid-call, whose request may have had its
-- effect (the key's outcome is then uncertain).
ALTER TABLE dedupq_keys
    ALTER COLUMN result_body TYPE bytea USING convert_to(result_body::text, 'UTF8'),
    ADD COLUMN result_content_type text,
    ADD COLUMN request_body bytea,
    ADD COLUMN request_content_type text,
    ADD COLUMN derived_key text,
    ADD COLUMN attempt_open boolean NOT NULL DEFAULT false;

UPDATE dedupq_keys SET result_content_type = 'application/json'
WHERE result_body IS NOT NULL;

-- Open rows of earlier releases may have been mid-call.
UPDATE dedupq_keys SET attempt_open = true WHERE status = 'in_progress';

-- Unknown outcomes of earlier releases may have used up their attempts:
-- hold them all for an operator (`dedupq keys settle` or `keys release`)
-- rather than let the next duplicate run the payment again.
UPDATE dedupq_keys SET lease_until = NULL WHERE status = 'unknown';
