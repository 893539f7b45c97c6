-- Statements of the Postgres dialect, in the format of internal/sqlfile.
-- {{schema}} is the quoted schema name, {{table}} the migrations table's
-- name (qualified by the schema when there is one) and {{pkey}} the name of
-- its primary key constraint. Locked runs them in one transaction.

-- name: current_schema
-- The first existing schema of the search_path, or NULL.
SELECT current_schema();

-- name: lock
-- Serializes the migrations of one schema across processes. $1 lock id.
SELECT pg_advisory_xact_lock($1);

-- name: schema_exists
-- CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege even when the
-- schema exists, so Locked asks first. $1 schema name.
SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1);

-- name: create_schema
CREATE SCHEMA {{schema}};

-- name: create_table
CREATE TABLE IF NOT EXISTS {{table}} (
    version    integer     NOT NULL CONSTRAINT {{pkey}} PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL
);

-- name: table_exists
-- $1 the table's name as {{table}} spells it.
SELECT to_regclass($1) IS NOT NULL;

-- name: applied
SELECT version, applied_at FROM {{table}};

-- name: record
-- $1 version, $2 name, $3 applied_at (the runner's clock).
INSERT INTO {{table}} (version, name, applied_at) VALUES ($1, $2, $3);

-- name: unrecord
-- $1 version.
DELETE FROM {{table}} WHERE version = $1;
