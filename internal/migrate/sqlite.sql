-- Statements of the SQLite dialect, in the format of internal/sqlfile.
-- {{table}} is the migrations table's quoted name and {{pkey}} the name of
-- its primary key constraint. Times are unix microseconds. Locked runs them
-- in one IMMEDIATE transaction.

-- name: create_table
CREATE TABLE IF NOT EXISTS {{table}} (
    version    INTEGER NOT NULL CONSTRAINT {{pkey}} PRIMARY KEY,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL
) STRICT;

-- name: table_exists
-- $1 the table's name, unquoted.
SELECT EXISTS (SELECT 1 FROM sqlite_schema WHERE type = 'table' AND name = ?1);

-- name: applied
SELECT version, applied_at FROM {{table}};

-- name: record
-- ?1 version, ?2 name, ?3 applied_at (the runner's clock).
INSERT INTO {{table}} (version, name, applied_at) VALUES (?1, ?2, ?3);

-- name: unrecord
-- ?1 version.
DELETE FROM {{table}} WHERE version = ?1;
