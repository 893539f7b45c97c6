-- The check across columns (idem_keys_response_check) becomes a call of a
-- plpgsql function of the five columns it relates: PostgreSQL reads a
-- table's check constraints again from their stored text, and prepares
-- them, for every statement that writes the table, at a cost that grows
-- with the expression's size, while a plpgsql function is compiled once per
-- connection. The rule is the same (and so is the constraint's name: a row
-- that breaks it is refused with a check violation). The parameters have
-- the columns' types, domains included, so that the check's expression is
-- the call and its five columns alone. The operator is named with its
-- schema: a plpgsql function resolves it when a connection first runs it.
-- Adding the check reads the table once (no rewrite).
CREATE FUNCTION {{schema}}.idem_response_ok(
    state {{schema}}.idem_state,
    response_status {{schema}}.idem_response_status,
    response_header jsonb,
    response_body bytea,
    not_replayable boolean)
RETURNS boolean LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    -- Only a completed record carries a response or the not-replayable
    -- mark, and a completed record has one of the two.
    RETURN CASE WHEN state OPERATOR(pg_catalog.=) 'completed'
                THEN response_status IS NOT NULL OR not_replayable
                ELSE response_status IS NULL AND response_header IS NULL
                     AND response_body IS NULL AND NOT not_replayable
           END;
END
$$;
-- Whoever writes the table runs the check, so runs the function: granted
-- to every role even where default privileges take EXECUTE from PUBLIC.
GRANT EXECUTE ON FUNCTION {{schema}}.idem_response_ok({{schema}}.idem_state,
    {{schema}}.idem_response_status, jsonb, bytea, boolean) TO PUBLIC;

ALTER TABLE {{schema}}.idem_keys
    DROP CONSTRAINT idem_keys_response_check,
    ADD CONSTRAINT idem_keys_response_check
        CHECK ({{schema}}.idem_response_ok(state, response_status,
            response_header, response_body, not_replayable));
