-- Statements of Migrate, MigrateDown and MigrationStatus, in the format of
-- queries.sql. They run in one transaction holding migrate_lock.

-- name: migrate_lock
-- Serializes the migrations of one schema across processes. $1 lock id.
SELECT pg_advisory_xact_lock($1);

-- name: schema_exists
-- CREATE SCHEMA IF NOT EXISTS needs the CREATE privilege even when the
-- schema exists, so the store asks first. $1 schema name.
SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1);

-- name: create_schema
CREATE SCHEMA {{schema}};

-- name: create_migrations_table
CREATE TABLE IF NOT EXISTS {{schema}}.idem_migrations (
    version    integer     NOT NULL CONSTRAINT idem_migrations_pkey PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL
);

-- name: migrations_table_exists
-- $1 schema name.
SELECT EXISTS (
    SELECT 1 FROM pg_tables WHERE schemaname = $1 AND tablename = 'idem_migrations');

-- name: applied_migrations
SELECT version, applied_at FROM {{schema}}.idem_migrations;

-- name: record_migration
-- $1 version, $2 name, $3 applied_at (the store's clock).
INSERT INTO {{schema}}.idem_migrations (version, name, applied_at) VALUES ($1, $2, $3);

-- name: unrecord_migration
-- $1 version.
DELETE FROM {{schema}}.idem_migrations WHERE version = $1;
